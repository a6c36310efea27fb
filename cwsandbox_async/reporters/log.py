"""A reporter that writes one structured line per flush to the library's log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._log import log
from ..metrics._snapshot import PREFIX

if TYPE_CHECKING:
    from ..metrics._snapshot import MetricsSnapshot

__all__ = ["LogReporter"]


class LogReporter:
    """``report_to=["log"]``: one ``"sandbox metrics"`` event at INFO per flush.

    The keys are the ``cwsandbox/`` names without the prefix, plus ``step``. Like
    every library log line, it is visible only if the application configured
    structlog, or set the ``cwsandbox_async`` logger to INFO.
    """

    name = "log"

    def available(self) -> bool:
        return True

    def report(self, snapshot: MetricsSnapshot, step: int) -> None:
        fields = {k.removeprefix(PREFIX): v for k, v in snapshot.as_dict().items()}
        log.info("sandbox metrics", step=step, **fields)
