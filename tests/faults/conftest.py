"""Fixtures for the fault suite: short client-side deadlines, and the invariants every seed must keep.

The library's grace periods (``EXEC_GRACE_SECONDS``: how long past an exec's own
timeout the client waits for a backend that stopped answering;
``STOP_TIMEOUT_SECONDS``: how long a destroy may take) are 10-15 s, sized for real
backends. Against the in-memory FakeBackend the suite shortens them, so that
hung calls hit their deadlines within a second and dozens of seeds run in seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from cwsandbox_async import _sandbox, _session
from cwsandbox_async._errors import SandboxError
from cwsandbox_async.gatherer._outcome import Outcome, OutcomeKind
from cwsandbox_async.pool import _pool
from cwsandbox_async.testing import FakeBackend

#: Shortened client-side grace periods (seconds); see the module docstring.
EXEC_GRACE = 0.2
STOP_TIMEOUT = 0.3


@pytest.fixture
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sandbox, "EXEC_GRACE_SECONDS", EXEC_GRACE)
    for module in (_sandbox, _session, _pool):
        monkeypatch.setattr(module, "STOP_TIMEOUT_SECONDS", STOP_TIMEOUT)


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
