"""A deadline that cuts an exec short: whose failure that is follows the backend's outside evidence.

The local backend's PID 1 enforces an exec's timeout and reports it; a report that misses the
caller's grace is infrastructure only when the backend saw evidence from outside the sandbox
(``late_verdict(True)``); without it (``late_verdict(False)``) it is the program's timeout. A backend
that says nothing keeps the old rule (a backend that stopped answering: infrastructure).
"""

from __future__ import annotations

import anyio
import pytest

import cwsandbox_async as cwa
from cwsandbox_async._deadline import backend_call, late_verdict


async def _slow_backend(verdict: bool | None) -> None:
    """A backend call that the deadline cuts, giving ``verdict`` (if any) as the cut reaches it."""
    try:
        await anyio.sleep(5)
    except anyio.get_cancelled_exc_class():
        if verdict is not None:
            late_verdict(verdict)
        raise


async def _call(verdict: bool | None) -> None:
    with backend_call("exec", 0.05, sandbox_id="sbx-x"):
        await _slow_backend(verdict)


async def _late(verdict: bool | None) -> cwa.SandboxTimeoutError:
    with pytest.raises(cwa.SandboxTimeoutError) as info:
        await _call(verdict)
    return info.value


@pytest.mark.parametrize(("verdict", "infrastructure"), [(False, False), (True, True), (None, True)])
async def test_a_cut_exec_is_infrastructure_only_with_outside_evidence(
    verdict: bool | None, infrastructure: bool
) -> None:
    err = await _late(verdict)
    assert err.infrastructure is infrastructure, err


async def test_a_verdict_does_not_leak_into_the_next_call() -> None:
    await _late(False)
    assert (await _late(None)).infrastructure
