"""The optional W&B table of a reward call's worst verdicts (``verdict_table=N``; off by default)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from .._log import log
from ._verdicts import CompletionVerdict, VerdictKind

__all__ = ["COLUMNS", "log_verdict_table", "worst"]

#: The table's columns, in order.
COLUMNS = ("index", "kind", "score", "reason", "exit_code", "wall_seconds", "cpu_seconds", "retries", "stderr_tail")


def worst(verdicts: Sequence[CompletionVerdict], n: int) -> list[CompletionVerdict]:
    """Up to ``n`` verdicts that did not pass, worst kind first (``VerdictKind.rank``), then the longest wall time."""
    failed = [v for v in verdicts if v.kind is not VerdictKind.PASSED]
    return sorted(failed, key=lambda v: (v.kind.rank, -(v.wall_seconds or 0.0), v.index))[:n]


def log_verdict_table(run: Any, key: str, verdicts: Sequence[CompletionVerdict], n: int, step: int | None) -> bool:
    """Log the ``n`` worst verdicts as a ``wandb.Table`` under ``key`` (with ``cwsandbox/step``).

    Uses ``run`` or, when it is None, ``wandb.run``. Returns False (logged at DEBUG) when
    wandb is not installed, no run is active, or nothing failed; a failing ``run.log`` is a
    warning, never an error of the reward call.
    """
    rows = worst(verdicts, n)
    if not rows:
        return False
    try:
        wandb: Any = importlib.import_module("wandb")
    except ImportError:
        log.debug("verdict table skipped: wandb is not installed")
        return False
    target = run if run is not None else wandb.run
    if target is None:
        log.debug("verdict table skipped: no W&B run")
        return False
    data = [[v.as_dict()[c] for c in COLUMNS] for v in rows]
    row: dict[str, Any] = {key: wandb.Table(columns=list(COLUMNS), data=data)}
    if step is not None:
        row["cwsandbox/step"] = step
    try:
        target.log(row)
    except Exception as exc:  # a table must never break a training step
        log.warning("verdict table not logged", error=repr(exc))
        return False
    return True
