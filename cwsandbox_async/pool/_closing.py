"""Closing a pool: the grace for held leases, then cancellation and destruction, within one budget."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from .._budget import CloseBudget
    from ._background import Background
    from ._disposal import Disposal
    from ._handout import Handout
    from ._ledger import Ledger

__all__ = ["teardown_scope", "wind_down"]


def teardown_scope(budget: CloseBudget, seconds: float) -> AbstractContextManager[anyio.CancelScope]:
    """A shielded cleanup step of the session's close budget, ending by ``seconds`` from now at the latest.

    Cleanup must run even when the caller was cancelled (then it gets ``seconds``), but
    it never outlives a deadline set above it: the session's close deadline (``budget``
    lowers every step in progress when a close starts), and the caller's own enclosing
    deadline (a ``fail_after`` around ``pool.aclose()``), whichever is sooner.
    """
    enclosing = anyio.current_effective_deadline()
    if enclosing != -math.inf:  # -inf: the caller is cancelled; cleanup still gets its own time
        seconds = min(seconds, max(0.0, enclosing - anyio.current_time()))
    return budget.shielded(seconds)


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

    Runs in ``teardown_scope(budget, seconds)``. The leases of the task that closes (a lease closing
    its own pool) are not waited for. Sandboxes of leases that do not end at once are
    destroyed under them. Returns False if the budget ran out first (what is left is the
    Session's to stop).
    """

    def no_other_leases() -> bool:
        return handout.leases_held(but_this_task=True) == 0

    with teardown_scope(budget, seconds) as scope:
        with anyio.move_on_after(grace):
            await ledger.until(no_other_leases)
        handout.cut_short_all()
        async with anyio.create_task_group() as tg:
            tg.start_soon(background.stop)
            tg.start_soon(disposal.destroy_all, ledger.take_all())
        await ledger.until(no_other_leases)
        await disposal.destroy_all([*ledger.take_all(), *disposal.take_orphans()])
    return not scope.cancelled_caught
