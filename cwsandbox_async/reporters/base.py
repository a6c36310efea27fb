"""The reporter interface: something that receives one frozen snapshot per flush."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..metrics._snapshot import MetricsSnapshot

__all__ = ["Reporter"]


@runtime_checkable
class Reporter(Protocol):
    """Receives ``MetricsSnapshot``s from ``Session.log_metrics`` and the close flush.

    ``available()`` says whether the reporter can take a snapshot now (a W&B
    reporter without a run cannot); when no reporter is available the window is
    kept and keeps accumulating. ``report()`` raises on failure; the session then
    logs a warning and keeps the window, so the next flush carries its data.
    Both are called with the session's flush lock held, possibly from a thread
    other than the event loop's.
    """

    name: str

    def available(self) -> bool: ...

    def report(self, snapshot: MetricsSnapshot, step: int) -> None: ...
