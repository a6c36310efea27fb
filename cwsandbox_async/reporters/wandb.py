"""The W&B reporter. It never imports wandb: a run exists only if the application did.

Steps: the reporter never passes ``step=`` to ``run.log`` (a step below W&B's
current one is silently dropped, and an explicit step leaves its row open for
other keys to overwrite). It logs its own ``cwsandbox/step`` with every row and
declares, once per run, ``define_metric("cwsandbox/step")`` and
``define_metric("cwsandbox/*", step_metric="cwsandbox/step")``, so the charts use
the training step and a flush can never be dropped. Each flush commits one row,
advancing W&B's internal ``_step`` by one. If you log your own metrics with an
explicit ``step=N``, call ``log_metrics`` after your last ``run.log`` for step N
(our row then joins and commits yours).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .._log import log
from ..metrics._snapshot import PREFIX, validate_namespace

if TYPE_CHECKING:
    from ..metrics._snapshot import MetricsSnapshot

__all__ = ["STEP_METRIC", "WandbReporter"]

STEP_METRIC = PREFIX + "step"


class WandbReporter:
    """Log snapshots to a W&B run: ``run`` if given, else whatever ``wandb.run`` is at flush time.

    An explicit ``run`` is needed for ART, whose ``wandb.init(reinit="create_new")``
    leaves ``wandb.run`` unset. Without one, the reporter follows ``wandb.run``
    (a later ``wandb.init`` is picked up) and is unavailable when there is none
    or wandb was never imported. A finished run is unavailable: the window is
    kept and ``Session.snapshot()`` still shows it. With ``warn_without_run`` (the
    user asked for W&B by name) a missing run is logged once as a warning.
    ``namespace`` puts every name under ``cwsandbox/<namespace>/`` (the step stays
    ``cwsandbox/step``), so several sessions can share one run.
    """

    name = "wandb"

    def __init__(self, run: Any = None, *, warn_without_run: bool = False, namespace: str | None = None) -> None:
        self._run = run
        self.namespace = validate_namespace(namespace)
        self._warn = warn_without_run
        self._declared: Any = None  # the run define_metric was sent to

    def current_run(self) -> Any:
        """The run the next flush goes to, or None."""
        run = self._run
        if run is None:
            wandb = sys.modules.get("wandb")  # never import it just to look
            run = getattr(wandb, "run", None) if wandb is not None else None
        if run is None or getattr(run, "_is_finished", False):
            return None
        return run

    def available(self) -> bool:
        if self.current_run() is not None:
            return True
        if self._warn:
            self._warn = False
            log.warning(
                "no active W&B run: sandbox metrics are kept until one exists",
                hint="pass Session(run=...) for runs opened with reinit='create_new' (ART)",
            )
        return False

    def report(self, snapshot: MetricsSnapshot, step: int) -> None:
        run = self.current_run()
        if run is None:
            raise RuntimeError("the W&B run finished before the flush")
        if run is not self._declared:
            run.define_metric(STEP_METRIC)
            run.define_metric(PREFIX + "*", step_metric=STEP_METRIC)
            self._declared = run
        run.log({STEP_METRIC: step, **snapshot.as_dict(self.namespace)})
