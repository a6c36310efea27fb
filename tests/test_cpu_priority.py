"""``cpu_priority``, the exec option a starved reward item's retry asks with: its validation, a backend
without the mechanism (the fake) running the command at its usual share, and the reward item's use of
it (the retry asks for it; the item's wall budget bounds the retry and cuts what does not report).

What the priority does on the local backend: ``tests/local/test_cpu_priority.py`` and
``tests/local/test_overload_penalty.py``.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async._types import ExecExit, ExecRequest
from cwsandbox_async.backends.base import OutputCallback
from cwsandbox_async.integrations._item import ItemSettings, run_item
from cwsandbox_async.integrations._verdicts import VerdictKind
from cwsandbox_async.testing import FakeBackend, Faults

BAD: list[dict[str, Any]] = [
    {"cpu_priority": 1},
    {"cpu_priority": "yes"},
    {"cpu_priority": True},  # neither exclusive nor a budget
    {"cpu_priority": True, "exclusive": True},  # no CPU budget: the priority would be unbounded
    {"cpu_priority": True, "cpu_seconds": 1.0},  # not exclusive: other processes would ride on it
]


@pytest.mark.parametrize("kwargs", BAD)
async def test_a_bad_priority_request_is_refused_before_the_backend(kwargs: dict[str, Any]) -> None:
    backend = FakeBackend()
    async with cwa.Session(backend=backend) as s:
        sb = await s.sandbox()
        for call in (sb.exec, sb.run_python):
            with pytest.raises(cwa.SandboxValidationError, match="cpu_priority"):
                await call("true", **kwargs)
        assert backend.exec_count == 0


class Recording(FakeBackend):
    """The fake (no priority mechanism: it ignores the flag), recording each request it was given; with
    ``hang_with_priority`` an exec that asks for priority never reports (a sandbox that stopped answering)."""

    def __init__(self, *, hang_with_priority: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.requests: list[ExecRequest] = []
        self.hang_with_priority = hang_with_priority

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        self.requests.append(request)
        if self.hang_with_priority and request.cpu_priority:
            await anyio.sleep_forever()
        return await super().exec(sandbox_id, request, on_output)


async def test_a_backend_without_the_mechanism_runs_the_command_as_usual() -> None:
    backend = Recording()
    async with cwa.Session(backend=backend) as s:
        sb = await s.sandbox()
        r = await sb.exec(["echo", "hi"], cpu_seconds=1.0, exclusive=True, cpu_priority=True)
        assert r.returncode == 0 and r.stdout == "hi\n"
    assert [q.cpu_priority for q in backend.requests] == [True]


async def test_a_starved_item_is_retried_with_priority_within_its_wall_budget() -> None:
    """Every run starved (the fake's fault): the retry asks for priority with the timeout as its CPU budget,
    its wall is what the item's budget (10 x 0.2 s) has left after one more timeout, and the item ends
    ``starved`` (None): starved even on its retry, it was never measured."""
    backend = Recording(faults=Faults(starve=1.0))
    settings = ItemSettings(timeout_seconds=0.2, python="python3")  # retry wall 40 s: the budget decides
    async with cwa.Session(backend=backend) as s:
        sb = await s.sandbox()
        with anyio.fail_after(HANG_GUARD_SECONDS):
            v = await run_item(sb, 0, "print(1)", None, settings)
    first, retry = backend.requests
    assert (first.cpu_priority, first.cpu_seconds, first.timeout_seconds) == (False, None, 0.2)
    assert (retry.cpu_priority, retry.exclusive, retry.cpu_seconds) == (True, True, 0.2)
    assert 0.2 <= retry.timeout_seconds <= 10 * 0.2 - 0.2 - 0.2, retry  # budget - the first run - one timeout
    assert v.kind is VerdictKind.STARVED and v.score is None and v.retries == 1, v


async def test_a_retry_that_never_reports_is_cut_at_the_items_wall_budget() -> None:
    backend = Recording(faults=Faults(starve=1.0), hang_with_priority=True)
    settings = ItemSettings(timeout_seconds=0.2, python="python3")
    async with cwa.Session(backend=backend) as s:
        sb = await s.sandbox()
        start = time.monotonic()
        with anyio.fail_after(HANG_GUARD_SECONDS):
            v = await run_item(sb, 0, "print(1)", None, settings)
        elapsed = time.monotonic() - start
    assert v.kind is VerdictKind.STARVED and v.score is None and v.retries == 1, v
    assert "wall budget (2 s, 10 x its timeout)" in v.reason, v
    assert elapsed >= 10 * 0.2  # it waited for the budget, not less; and returned (the guard did not fire)


async def test_no_retry_when_the_budget_has_less_than_one_timeout_left() -> None:
    """With a wall budget of 1.5 timeouts, what is left after the starved first run and one timeout for the
    report is less than a timeout: not enough wall to give the program its CPU time, so no retry."""
    backend = Recording(faults=Faults(starve=1.0))
    settings = ItemSettings(timeout_seconds=0.2, python="python3", wall_factor=1.5)
    async with cwa.Session(backend=backend) as s:
        sb = await s.sandbox()
        with anyio.fail_after(HANG_GUARD_SECONDS):
            v = await run_item(sb, 0, "print(1)", None, settings)
    assert len(backend.requests) == 1
    assert v.kind is VerdictKind.STARVED and v.score is None and v.retries == 0, v
