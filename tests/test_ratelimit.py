"""TokenBucket (``_ratelimit``): the Kubernetes client's request pacing (the pool uses aiolimiter)."""

from __future__ import annotations

import math

import anyio
import pytest

from cwsandbox_async import SandboxValidationError
from cwsandbox_async._ratelimit import TokenBucket


async def test_token_bucket_burst_then_rate() -> None:
    now = [0.0]

    async def fake_sleep(seconds: float) -> None:
        now[0] += seconds
        await anyio.lowlevel.checkpoint()

    bucket = TokenBucket(10, 2, clock=lambda: now[0], sleep=fake_sleep)
    for _ in range(5):
        await bucket.acquire()
    assert now[0] == pytest.approx(0.3)  # 2 from the burst, then 3 at 10/s
    assert not bucket.try_acquire()
    now[0] += 0.1
    assert bucket.try_acquire()
    now[0] += 100
    assert bucket.statistics().tokens == 2  # never more than the burst
    assert bucket.statistics().acquired == 6


async def test_token_bucket_cancelled_waiter_takes_no_token() -> None:
    bucket = TokenBucket(1, 1)
    await bucket.acquire()
    with anyio.move_on_after(0.05):
        await bucket.acquire()  # would wait ~1 s
    assert bucket.statistics().acquired == 1
    assert bucket.statistics().waiting == 0


@pytest.mark.parametrize(("rate", "burst"), [(0, None), (-1, None), (math.inf, None), (True, None), (1, 0), (1, 1.5)])
def test_token_bucket_validation(rate: float, burst: int | None) -> None:
    with pytest.raises(SandboxValidationError):
        TokenBucket(rate, burst)
