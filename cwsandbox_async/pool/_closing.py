"""Closing a pool: the grace for held leases, then cancellation and destruction, within one budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from .._budget import CloseBudget
    from ._background import Background
    from ._disposal import Disposal
    from ._handout import Handout
    from ._ledger import Ledger

__all__ = ["wind_down"]


async def wind_down(
    ledger: Ledger,
    handout: Handout,
    disposal: Disposal,
    background: Background,
    *,
    budget: CloseBudget,
    grace: float,
    seconds: float,
) -> bool:
    """Let held leases finish for ``grace``, cut the rest short, stop the background, destroy everything.

    Runs as one shielded step of the session's close budget (``budget.shielded(seconds)``):
    it gets ``seconds`` even when the caller was cancelled, but never outlives the session's
    close deadline or the caller's own enclosing deadline. The leases of the task that
    closes (a lease closing its own pool) are not waited for. Sandboxes of leases that do
    not end at once are destroyed under them. Returns False if the budget ran out first (what is left is the
    Session's to stop).
    """

    def no_other_leases() -> bool:
        return handout.leases_held(but_this_task=True) == 0

    with budget.shielded(seconds, caller_bounds=True) as scope:
        with anyio.move_on_after(grace):
            await ledger.until(no_other_leases)
        handout.cut_short_all()
        async with anyio.create_task_group() as tg:
            tg.start_soon(background.stop)
            tg.start_soon(disposal.destroy_all, ledger.take_all())
        await ledger.until(no_other_leases)
        await disposal.destroy_all([*ledger.take_all(), *disposal.take_orphans()])
    return not scope.cancelled_caught
