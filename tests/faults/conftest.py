"""Fixtures for the fault suite: virtual time, and the invariants every seed must keep.

A module that overrides ``anyio_backend`` with ``virtual_time()`` runs on a
looptime event loop: the loop's clock jumps ahead whenever
every task is waiting on a timer, so deadlines and the FakeBackend's latencies
take no wall-clock time and dozens of seeds run in well under a second each.
Bounds are asserted on the loop's clock (``anyio.current_time()``). The sessions
use short client-side grace periods (``TIMEOUTS``; the defaults are sized for
real backends), so the bounds per item stay tight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import looptime

from cwsandbox_async import Timeouts
from cwsandbox_async._errors import SandboxError
from cwsandbox_async.gatherer._outcome import Outcome, OutcomeKind
from cwsandbox_async.testing import FakeBackend

#: Short client-side grace periods: how long past an exec's own timeout the client waits for a backend
#: that stopped answering, and how long one destroy may take.
TIMEOUTS = Timeouts(exec_grace_seconds=0.2, stop_seconds=0.3)


def virtual_time() -> tuple[str, dict[str, Any]]:
    """The ``anyio_backend`` of a module whose tests run in virtual time (see the module docstring)."""
    return "asyncio", {"loop_factory": looptime.new_event_loop}


def tasks_now() -> int:
    return len(asyncio.all_tasks())


def check_outcomes(outcomes: Sequence[Outcome[str]], keys: Sequence[int], *, expect_ok: bool = False) -> dict[str, int]:
    """Every input has exactly one outcome; OK ones hold their own item's output; the rest are typed INFRA.

    Returns the count per kind (and per error class) for the caller's further checks.
    """
    assert sorted(o.key for o in outcomes) == sorted(keys), "an outcome was lost or duplicated"
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.ok:
            assert o.value == f"{o.key}\n", f"item {o.key} got another item's result: {o.value!r}"
        else:
            assert not expect_ok, f"item {o.key} failed after the faults were cleared: {o.error!r}"
            assert o.kind is OutcomeKind.INFRA, f"item {o.key}: {o.kind.value} {o.error!r}"
            assert isinstance(o.error, SandboxError) and o.error.infrastructure, repr(o.error)
            counts[type(o.error).__name__] = counts.get(type(o.error).__name__, 0) + 1
        counts[o.kind.value] = counts.get(o.kind.value, 0) + 1
    return counts


def alive_ids(backend: FakeBackend) -> set[str]:
    return {sid for sid, sb in backend.world.items() if sb.alive}
