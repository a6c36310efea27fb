"""The creation pacer: AIMD on creations in flight, driven by measured latency and failures."""

from __future__ import annotations

import anyio

from cwsandbox_async.pool._pacing import Pacer


def pacer(**kw: object) -> Pacer:
    opts: dict[str, object] = {"fixed": None, "ceiling": 1000, "tolerance": 3.0, **kw}
    return Pacer(**opts)  # type: ignore[arg-type]


async def test_slow_start_grows_by_one_per_create_only_while_the_limit_binds() -> None:
    p = pacer()
    assert p.limit == Pacer.INITIAL
    for _ in range(6):
        p.succeeded(anyio.current_time(), 1.0, limited=True)
    assert p.limit == Pacer.INITIAL + 6
    for _ in range(20):  # demand below the cap: good latency is no evidence for a higher one
        p.succeeded(anyio.current_time(), 1.0, limited=False)
    assert p.limit == Pacer.INITIAL + 6


async def test_rising_latency_shrinks_once_per_round_and_ends_slow_start() -> None:
    p = pacer()
    for _ in range(18):
        p.succeeded(anyio.current_time(), 1.0, limited=True)
    assert p.limit == 20
    started = anyio.current_time()
    await anyio.sleep(1)
    half = Pacer.WINDOW // 2
    for _ in range(half + 1):  # the window's median climbs past 3x the baseline once most of it is slow
        p.succeeded(started, 4.0, limited=True)
    # it grew while the median was still low, then shrank once
    assert int(20 * Pacer.DECREASE) <= p.limit <= int((20 + half) * Pacer.DECREASE) < 20
    shrunk = p.limit
    for _ in range(Pacer.WINDOW):  # creates started before that shrink do not shrink it again (nor count)
        p.succeeded(started, 4.0, limited=True)
    assert p.limit == shrunk
    await anyio.sleep(1)
    for _ in range(3 + 2 * shrunk):  # additive increase now: about +1 per limit's worth of completions
        p.succeeded(anyio.current_time(), 1.0, limited=True)
    assert p.limit in (shrunk + 1, shrunk + 2)


async def test_one_slow_create_is_noise_not_congestion() -> None:
    p = pacer()
    for _ in range(8):
        p.succeeded(anyio.current_time(), 1.0, limited=True)
    before = p.limit
    p.succeeded(anyio.current_time(), 30.0, limited=True)  # an image pull, say
    assert p.limit >= before


async def test_failures_halve_the_limit_but_never_below_one() -> None:
    p = pacer()
    for _ in range(30):
        p.succeeded(anyio.current_time(), 1.0, limited=True)
    assert p.limit == 32
    p.failed(anyio.current_time() + 1)
    assert p.limit == 16
    for _ in range(10):
        await anyio.sleep(1)
        p.failed(anyio.current_time())
    assert p.limit == 1


async def test_the_ceiling_and_a_fixed_limit_hold() -> None:
    p = pacer(ceiling=5)
    for _ in range(50):
        p.succeeded(anyio.current_time(), 1.0, limited=True)
    assert p.limit == 5
    p.set_ceiling(3)
    assert p.limit == 3
    fixed = pacer(fixed=7)
    for _ in range(50):
        fixed.succeeded(anyio.current_time(), 10.0 * _ + 1, limited=True)
        fixed.failed(anyio.current_time())
    assert fixed.limit == 7


async def test_the_baseline_relearns_a_machine_that_got_slower() -> None:
    p = pacer()
    for _ in range(10):
        p.succeeded(anyio.current_time(), 1.0, limited=True)
    slow_limit = None
    for i in range(1500):  # the machine is now 4x slower for good, whatever the concurrency
        await anyio.sleep(0.01)
        p.succeeded(anyio.current_time(), 4.0, limited=True)
        if i == 100:
            slow_limit = p.limit
    assert slow_limit is not None
    assert p.limit > slow_limit  # it grows again once the baseline has caught up
