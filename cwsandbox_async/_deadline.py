"""``backend_call``: the deadline of one backend call, and what its failures mean.

Written the way ``anyio.fail_after`` is, around the awaited call itself::

    with backend_call("exec", seconds, sandbox_id=sid):
        ex = await backend.exec(sid, request, on_output)

The only translation above the backend boundary is the deadline's own: a call
that misses it is ``SandboxTimeoutError(infrastructure=True)`` (the backend
stopped answering; the program under test cannot cause that, since a command's
own timeout is enforced by the backend and returned as a result). Everything
else is the backend's to translate (``backends/base.py``): a ``SandboxError``
passes through as raised, and any other exception is a bug in the backend. It
propagates unchanged, logged at ERROR, and is never relabelled as
infrastructure, so GRPO never silently drops a sample because of a ``KeyError``.
Cancellation from outside passes through untouched.

One exception, for an exec whose backend can tell: a backend that supervises the
command's timeout inside the sandbox (the local one: PID 1 kills it and reports)
can have its report delayed by the program itself, so a missed deadline there is
not evidence of a broken backend. Such a backend calls ``late_verdict`` as the cut
reaches it, with whether it saw evidence from outside the sandbox (the machine's
other work holding the CPUs, or its report already waiting for a driver that was
late to read it). Without that evidence the cut is the program's own timeout
(``infrastructure=False``); a backend that says nothing keeps the rule above.

A cleanup call (a destroy) passes ``budget``: it then runs shielded from its
caller's cancellation, bounded by ``min(seconds, the close deadline)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

import anyio

from ._budget import CloseBudget
from ._errors import SandboxError, SandboxTimeoutError
from ._log import log
from ._verdict import LATE_VERDICT as _LATE
from ._verdict import late_verdict

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = ["backend_call", "destroy", "late_verdict"]


#: A backend's verdict on its own late report (see the module docstring): None, not given.
@contextmanager
def backend_call(
    what: str, seconds: float, *, sandbox_id: str | None = None, budget: CloseBudget | None = None
) -> Iterator[anyio.CancelScope]:
    """Run the block for at most ``seconds`` (shielded, within ``budget``, if given); see the module docstring.

    Raises ``SandboxTimeoutError(infrastructure=True)`` when the deadline cut the block short."""
    scope: AbstractContextManager[anyio.CancelScope]
    scope = anyio.move_on_after(seconds) if budget is None else budget.shielded(seconds)
    start = anyio.current_time()
    token = _LATE.set(None)
    try:
        with scope as cancel_scope:
            try:
                yield cancel_scope
            except SandboxError:
                raise
            except Exception as exc:
                log.error(
                    "backend bug: an exception outside the SandboxError tree",
                    call=what,
                    sandbox_id=sandbox_id,
                    error=repr(exc),
                )
                raise
        verdict = _LATE.get()
    finally:
        _LATE.reset(token)
    if not cancel_scope.cancelled_caught:
        return
    if budget is not None and budget.deadline < start + seconds:
        limit = f"{max(budget.deadline - start, 0.0):.3g} s (the close deadline)"
    else:
        limit = f"{seconds:g} s"
    if verdict is False:
        log.info("late report without outside evidence: the program's timeout", call=what, sandbox_id=sandbox_id)
        raise SandboxTimeoutError(
            f"{what} did not finish within {limit}: the sandbox reported late, and nothing outside it held"
            " the machine (the program's own timeout)",
            sandbox_id=sandbox_id,
            infrastructure=False,
        )
    raise SandboxTimeoutError(f"{what} did not finish within {limit}", sandbox_id=sandbox_id, infrastructure=True)


async def destroy(backend: Backend, sandbox_id: str, *, seconds: float, budget: CloseBudget) -> None:
    """Destroy a sandbox as a cleanup step (shielded, within ``seconds`` and ``budget``); log and raise a failure."""
    try:
        with backend_call("destroy", seconds, sandbox_id=sandbox_id, budget=budget):
            await backend.destroy(sandbox_id)
    except SandboxError as exc:
        log.warning("sandbox destroy failed", sandbox_id=sandbox_id, error=repr(exc))
        raise
