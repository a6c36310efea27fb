"""Metric reporters. ``Session(report_to=[...])`` takes their names or instances.

- ``"wandb"``: ``WandbReporter``, logs to a W&B run (wandb is never imported here).
- ``"log"``: ``LogReporter``, one structured line per flush.
- Your own: any object with ``name``, ``available()`` and ``report(snapshot, step)``.
"""

from __future__ import annotations

from .base import Reporter
from .log import LogReporter
from .wandb import STEP_METRIC, WandbReporter

__all__ = ["STEP_METRIC", "LogReporter", "Reporter", "WandbReporter"]
