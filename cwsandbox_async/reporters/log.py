"""A reporter that writes one structured line per flush to the library's log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._log import log
from ..metrics._snapshot import PREFIX, validate_namespace

if TYPE_CHECKING:
    from ..metrics._snapshot import MetricsSnapshot

__all__ = ["LogReporter"]


class LogReporter:
    """``report_to=["log"]``: one ``"sandbox metrics"`` event at INFO per flush.

    The keys are the ``cwsandbox/`` names without the prefix, plus ``step`` (and
    ``namespace`` when given; a teardown-only close flush has ``teardown/`` keys).
    Like every library log line, it is visible only if the application configured
    structlog, or set the ``cwsandbox_async`` logger to INFO.
    """

    name = "log"

    def __init__(self, *, namespace: str | None = None) -> None:
        self.namespace = validate_namespace(namespace)

    def available(self) -> bool:
        return True

    def report(self, snapshot: MetricsSnapshot, step: int) -> None:
        prefix = PREFIX + (f"{self.namespace}/" if self.namespace else "")
        fields: dict[str, object] = {k.removeprefix(prefix): v for k, v in snapshot.as_dict(self.namespace).items()}
        if self.namespace:
            fields["namespace"] = self.namespace
        log.info("sandbox metrics", step=step, **fields)
