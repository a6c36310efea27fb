"""Closing a pool: the grace for held leases, then cancellation and destruction, within one budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from ._background import Background
    from ._disposal import Disposal
    from ._handout import Handout
    from ._ledger import Ledger

__all__ = ["teardown_scope", "wind_down"]


def teardown_scope(budget: float) -> anyio.CancelScope:
    """A shielded scope for cleanup that ends by ``budget`` seconds from now, or earlier if the caller's does.

    Cleanup must run even when the caller was cancelled (then it gets ``budget``), but it
    never extends a deadline set above it: inside ``Session`` close (or a caller's
    ``fail_after``) the enclosing deadline, if sooner, is the one that holds.
    """
    now = anyio.current_time()
    enclosing = anyio.current_effective_deadline()
    deadline = now + budget
    if enclosing != -float("inf"):  # -inf: the caller is cancelled; cleanup still gets its own budget
        deadline = min(deadline, enclosing)
    return anyio.CancelScope(shield=True, deadline=deadline)


async def wind_down(
    ledger: Ledger, handout: Handout, disposal: Disposal, background: Background, *, grace: float, budget: float
) -> bool:
    """Let held leases finish for ``grace``, cut the rest short, stop the background, destroy everything.

    Runs in ``teardown_scope(budget)``. The leases of the task that closes (a lease closing
    its own pool) are not waited for. Sandboxes of leases that do not end at once are
    destroyed under them. Returns False if the budget ran out first (what is left is the
    Session's to stop).
    """

    def no_other_leases() -> bool:
        return handout.leases_held(but_this_task=True) == 0

    with teardown_scope(budget) as scope:
        with anyio.move_on_after(grace):
            await ledger.until(no_other_leases)
        handout.cut_short_all()
        async with anyio.create_task_group() as tg:
            tg.start_soon(background.stop)
            tg.start_soon(disposal.destroy_all, ledger.take_all())
        await ledger.until(no_other_leases)
        await disposal.destroy_all([*ledger.take_all(), *disposal.take_orphans()])
    return not scope.cancelled_caught
