"""Per-step flushing: picks the reporters, numbers the steps, never loses a window.

Step rules (documented on ``Session.log_metrics``):

- ``step=None`` means the last step used + 1 (0 for the first flush).
- The close flush reports what happened since the last flush as step ``last + 1``:
  that activity came after step ``last`` was logged, so it is the next step's, and
  the ``cwsandbox/step`` axis stays strictly increasing. Nothing is passed as W&B's
  ``step=``, so W&B's own step never goes backwards either. A window in which
  nothing ran and nothing was leased (the teardown of the pool and of whatever
  was still open, and a pool's refills after the last step) is no step's work:
  it goes out at step ``last`` under ``cwsandbox/teardown/*``
  (``MetricsSnapshot.teardown``), never as a trailing row of zeros.
- Nothing is dropped without a word: the first ``log_metrics`` that finds no
  reporter able to take the window (no W&B run) logs a warning, and so does a
  close that cannot deliver what is left (unless reporting was never asked for:
  no ``report_to``, no ``run`` and no ``log_metrics`` call).
- After a flush for step N, ``step=N+1`` is bound in structlog's contextvars (in
  the caller's context): library log lines from then on carry the step their
  events will be reported under if steps are consecutive. The flush's own lines
  carry ``step=N``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog

from .._errors import SandboxValidationError
from .._log import log
from ..reporters.base import Reporter
from ..reporters.log import LogReporter
from ..reporters.wandb import WandbReporter
from ._snapshot import validate_namespace

if TYPE_CHECKING:
    import contextvars
    from collections.abc import Mapping

    from ._aggregator import MetricsAggregator

__all__ = ["MetricsReporting", "resolve_reporters"]

REPORTER_NAMES = ("log", "wandb")


def resolve_reporters(
    report_to: str | Sequence[str | Reporter] | None, run: Any = None, *, namespace: str | None = None
) -> list[Reporter]:
    """Turn ``Session(report_to=..., run=..., metrics_namespace=...)`` into reporters.

    ``None``: W&B if a run is active at flush time (``run`` if given, else
    ``wandb.run``; wandb is never imported to look). ``[]``: nothing. Names:
    ``"wandb"`` (raises ``SandboxValidationError`` if wandb is not installed),
    ``"log"``; ``Reporter`` objects are used as they are. A ``run`` adds W&B to
    any non-empty list. ``namespace`` goes to the W&B and log reporters built here
    (your own reporters read it from the snapshot's ``as_dict`` call they make).
    Raises ``SandboxValidationError`` for an unknown name, a bad namespace, or
    ``run`` together with ``report_to=[]``.
    """
    validate_namespace(namespace)
    if report_to is None:
        return [WandbReporter(run, namespace=namespace)]
    items: Sequence[str | Reporter] = [report_to] if isinstance(report_to, str) else report_to
    if isinstance(items, (bytes, bytearray)) or not isinstance(items, Sequence):
        raise SandboxValidationError("report_to must be None, a name, or a list of names/reporters")
    if not items and run is not None:
        raise SandboxValidationError("run= was given but report_to=[] disables reporting")
    reporters: list[Reporter] = []
    names: set[str] = set()
    for item in items:
        if isinstance(item, str):
            if item not in REPORTER_NAMES:
                raise SandboxValidationError(f"unknown reporter {item!r}; expected one of {REPORTER_NAMES}")
            if item in names:
                continue
            names.add(item)
            if item == "log":
                reporters.append(LogReporter(namespace=namespace))
            else:
                if run is None and importlib.util.find_spec("wandb") is None:
                    raise SandboxValidationError(
                        "report_to=['wandb'] needs wandb: pip install 'cwsandbox-async[wandb]'"
                    )
                reporters.append(WandbReporter(run, warn_without_run=True, namespace=namespace))
        elif isinstance(item, Reporter):
            reporters.append(item)
        else:
            raise SandboxValidationError(f"report_to items must be names or reporters, not {type(item).__name__}")
    if run is not None and "wandb" not in names:
        reporters.append(WandbReporter(run, namespace=namespace))
    return reporters


class MetricsReporting:
    """The session's flush path: one lock, one step counter, the reporters."""

    def __init__(self, metrics: MetricsAggregator, reporters: list[Reporter], *, quiet: bool = False) -> None:
        self._metrics = metrics
        self.reporters = reporters
        self._quiet = quiet  # reporting was not asked for: an undelivered close flush is not news
        self._asked = False  # log() was called: reporting was wanted after all
        self._warned_unavailable = False
        self._lock = threading.Lock()
        self.last_step: int | None = None
        self._token: Mapping[str, contextvars.Token[Any]] | None = None

    @classmethod
    def from_options(
        cls,
        metrics: MetricsAggregator,
        report_to: str | Sequence[str | Reporter] | None,
        run: Any,
        namespace: str | None = None,
    ) -> MetricsReporting:
        """The session's reporting for ``Session(report_to=..., run=...)`` (see ``resolve_reporters``)."""
        reporters = resolve_reporters(report_to, run, namespace=namespace)
        return cls(metrics, reporters, quiet=not report_to and run is None)

    def log(self, step: int | None, *, reset: bool = True) -> bool:
        """Flush the window to every available reporter. True if all of them (one at least) took it.

        Returns False, keeping the window, when no reporter is available (the
        first time, with a warning saying so, unless reporting is disabled with
        ``report_to=[]``) or nothing happened since the last flush. A reporter that
        raises is logged as a warning and the window is kept (``reset`` undone),
        so its data goes out with the next flush. Raises ``SandboxValidationError``
        for a step that is not a non-negative int.
        """
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise SandboxValidationError(f"step must be a non-negative int, not {step!r}")
        with self._lock:
            if step is None:
                step = 0 if self.last_step is None else self.last_step + 1
            elif self.last_step is not None and step < self.last_step:
                log.info("metrics step went backwards", step=step, last_step=self.last_step)
            self.last_step = step
            self._asked = True
            with structlog.contextvars.bound_contextvars(step=step):
                delivered = self._flush(step, reset, warn=True)
        tokens = structlog.contextvars.bind_contextvars(step=step + 1)
        if self._token is None:
            self._token = tokens
        return delivered

    def close(self) -> None:
        """The close flush: what is left, as step ``last + 1`` (teardown only: at ``last``). Never raises."""
        try:
            with self._lock:
                snapshot = self._metrics.snapshot()
                if snapshot.has_activity:
                    last = self.last_step
                    teardown = snapshot.only_teardown and last is not None
                    step = 0 if last is None else last if teardown else last + 1
                    with structlog.contextvars.bound_contextvars(step=step):
                        if self._flush(step, True, teardown=teardown):
                            self.last_step = step
                        elif self.reporters and (not self._quiet or self._asked):
                            log.warning("sandbox metrics of the last step were not reported", step=step)
        except Exception as exc:  # a close must not fail because of metrics
            log.warning("final metrics flush failed", error=repr(exc))
        if self._token is not None:
            # bound in another context (a thread): nothing to undo here
            with contextlib.suppress(ValueError, RuntimeError):
                structlog.contextvars.reset_contextvars(**self._token)
            self._token = None

    def _flush(self, step: int, reset: bool, *, warn: bool = False, teardown: bool = False) -> bool:
        targets = [r for r in self.reporters if r.available()]
        if not targets:
            if warn and self.reporters and not self._warned_unavailable and self._metrics.snapshot().has_activity:
                self._warned_unavailable = True
                log.warning(
                    "log_metrics: no reporter can take the sandbox metrics; they are kept (session.snapshot())",
                    step=step,
                    reporters=[r.name for r in self.reporters],
                    hint="no W&B run: pass Session(run=...), or report_to=['log'], or report_to=[] to disable",
                )
            return False
        snapshot, window = self._metrics.take(reset=reset)
        if not snapshot.has_activity:
            if window is not None:
                self._metrics.restore(window)
            return False
        if teardown and snapshot.only_teardown:
            snapshot = dataclasses.replace(snapshot, teardown=True)
        ok = True
        for reporter in targets:
            try:
                reporter.report(snapshot, step)
            except Exception as exc:
                ok = False
                log.warning("metrics reporter failed", reporter=reporter.name, error=repr(exc))
        if not ok and window is not None:
            self._metrics.restore(window)
        return ok
