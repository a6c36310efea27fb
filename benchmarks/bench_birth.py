"""Sandbox creation on the local backend versus the kernel's floor for a fresh sandbox, in one run.

The baseline is what any fresh sandbox must pay at least: a small preloaded Python process forks,
the child enters new user, mount, uts, ipc, pid and net namespaces (``unshare(2)``) and forks the
first process of its new pid namespace, which reports back over a pipe. It runs in a helper
process started once (``python3 -I -S``, as the sandbox's own interpreter), timed inside the helper.
``ours`` is ``Session.sandbox()`` until the sandbox is ready to run commands (the whole library
path: cgroups, registry, birth from the template, the agent's hello), each sandbox stopped after
(not timed). The two alternate, one of each per round, so both see the same machine load.

    python -m benchmarks.bench_birth [--quick]

Also prints where a birth's time goes (``STEPS``: medians of the time between consecutive
``time.monotonic()`` stamps, the driver's from ``_born`` and the sandbox's from its hello; the
driver's cgroup and registry work runs beside the template's fork).
Writes ``benchmarks/out/birth.json`` (headline: ``create_p50_ratio``, ``create_p99_ratio``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import cwsandbox_async as cwa

from ._common import parse_args, percentile, write_json

#: The floor: fork, unshare all namespaces, first child in the new pid namespace (timed inside).
BASELINE = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
FLAGS = 0x10000000 | 0x20000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000  # user mnt uts ipc pid net
for line in sys.stdin:
    r, w = os.pipe()
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        if libc.unshare(FLAGS) != 0:
            os._exit(1)
        if os.fork() == 0:
            os.write(w, b"x")
            os._exit(0)
        os._exit(0)
    os.read(r, 1)
    took = time.perf_counter() - t
    os.waitpid(pid, 0)
    os.close(r)
    os.close(w)
    sys.stdout.write(f"{took}\n")
    sys.stdout.flush()
"""


class Baseline:
    """The helper process; ``once()`` runs one timed iteration in it."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Baseline:
        self.proc = await asyncio.create_subprocess_exec(
            self.python, "-I", "-S", "-c", BASELINE, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        await self.proc.wait()

    async def once(self) -> float:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the baseline helper died (can this user create namespaces?)")
        return float(line)


#: (name, from stamp, to stamp) of a birth's steps; "d:" stamps are the driver's, "s:" the sandbox's.
STEPS = (
    ("driver asks the template to fork", "d:start", "d:fork_sent"),
    ("template forks the newborn", "d:fork_sent", "s:c_forked"),
    ("driver: registry, cgroups, their fds (thread)", "d:start", "d:prepared"),
    ("newborn waits for its configuration", "s:c_forked", "s:c_configured"),
    ("newborn joins cgroups, enters namespaces", "s:c_configured", "s:c_entered"),
    ("newborn forks PID 1", "s:c_entered", "s:g_forked"),
    ("PID 1: mounts, hostname, read-only root", "s:g_forked", "s:g_mounted"),
    ("PID 1: capabilities, keyring, seccomp", "s:g_mounted", "s:hardened"),
    ("PID 1: its loop, hello sent", "s:hardened", "s:hello"),
    ("hello reaches the driver", "s:hello", "d:hello"),
    ("driver: ready", "d:hello", "d:running"),
    ("total", "d:start", "d:running"),
)


def birth_stamps(session: cwa.Session, sb: cwa.Sandbox) -> dict[str, float]:
    """The driver's and the sandbox's stamps of one birth (a peek into the local backend)."""
    box = session.backend._boxes[sb.sandbox_id]  # type: ignore[attr-defined]
    hello = (box.channel.hello or {}).get("stamps") or {}
    return {**{f"d:{k}": v for k, v in box.stamps.items()}, **{f"s:{k}": v for k, v in hello.items()}}


def breakdown(stamps: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, a, b in STEPS:
        values = [s[b] - s[a] for s in stamps if a in s and b in s]
        if values:
            out[name] = round(percentile(values, 50) * 1e3, 3)
    return out


def stats_ms(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(percentile(values, 50) * 1e3, 3),
        "p90": round(percentile(values, 90) * 1e3, 3),
        "p99": round(percentile(values, 99) * 1e3, 3),
    }


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds = 40 if args.quick else 300
    async with cwa.Session(backend="local", handle_signals=False) as session:
        python = session.backend._python  # type: ignore[attr-defined]  # the sandbox's own interpreter
        await (await session.sandbox()).stop()  # the template starts here, once: not timed
        ours: list[float] = []
        base: list[float] = []
        stamps: list[dict[str, float]] = []
        async with Baseline(python) as baseline:
            for _ in range(5):  # warm-up
                await baseline.once()
            for _ in range(rounds):
                t = time.perf_counter()
                sb = await session.sandbox()
                ours.append(time.perf_counter() - t)
                stamps.append(birth_stamps(session, sb))
                await sb.stop()
                base.append(await baseline.once())
    load = os.getloadavg()
    result: dict[str, Any] = {
        "what": "Session.sandbox() until ready vs fork + unshare(user, mnt, uts, ipc, pid, net) + first child",
        "load_average": [round(x, 2) for x in load],
        "create_ms": stats_ms(ours),
        "baseline_ms": stats_ms(base),
        "steps_p50_ms": breakdown(stamps),
        "headline": {
            "create_p50_ratio": round(percentile(ours, 50) / percentile(base, 50), 2),
            "create_p99_ratio": round(percentile(ours, 99) / percentile(base, 99), 2),
        },
    }
    path = write_json("birth", result)
    print(f"create       {result['create_ms']}")
    print(f"baseline     {result['baseline_ms']}")
    for name, value in result["steps_p50_ms"].items():
        print(f"  {name:48s} p50 {value:7.3f} ms")
    print(f"ratios       {result['headline']}  (load {result['load_average']})  -> {path}")


if __name__ == "__main__":
    asyncio.run(main())
