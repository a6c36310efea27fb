"""Exec round trip on a warm local sandbox versus a bare host subprocess, and sandbox creation latency.

For ``true`` and ``python3 -c pass``, at concurrency 1 and 8, the same command is
run alternately through ``Sandbox.exec`` on a warm local sandbox (the whole library
path: validation, deadline, agent round trip, metrics) and with
``asyncio.create_subprocess_exec`` on the host (stdout/stderr piped, as the
sandbox does). Both sides use the same interpreter for ``python3`` (the one the
sandbox finds on its PATH). ``run_python("pass")`` (a fork of the agent's warm
interpreter) is compared with the host's ``python3 -c pass``. Each command also runs, in the same
rotation, in a sandbox of a second session whose commands fork PID 1 (the pure-Python path,
``CWSANDBOX_LOCAL_SPAWNER=python``): the native spawner's before/after in one run. Creation latency is
``session.sandbox()`` until ready, each sandbox stopped after.

    python -m benchmarks.bench_exec [--quick]
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import _native
from cwsandbox_async.backends.local._bwrap import SANDBOX_PATH

from ._common import parse_args, summary, write_json
from ._cpu import read_ns, self_ns, task_ns


async def host_run(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}")


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def paired(
    ours: Callable[[], Awaitable[Any]],
    base: Callable[[], Awaitable[Any]],
    n: int,
    concurrency: int,
    also: Callable[[], Awaitable[Any]] | None = None,
) -> tuple[list[float], list[float], float, float, list[float]]:
    """Latencies of ``ours`` and ``base`` (and ``also``, a second variant of ours, when given) run
    alternately in ``concurrency`` parallel loops; ops/s of ours and base; ``also``'s latencies."""
    a: list[float] = []
    b: list[float] = []
    c: list[float] = []
    busy = {"ours": 0.0, "base": 0.0}

    async def loop(count: int) -> None:
        for _ in range(count):
            t = await timed(ours)
            a.append(t)
            busy["ours"] += t
            t = await timed(base)
            b.append(t)
            busy["base"] += t
            if also is not None:
                c.append(await timed(also))

    for _ in range(3):  # warm-up, not recorded
        await ours()
        await base()
        if also is not None:
            await also()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(loop, max(1, n // concurrency))
    rate_ours = len(a) * concurrency / busy["ours"] if busy["ours"] else 0.0
    rate_base = len(b) * concurrency / busy["base"] if busy["base"] else 0.0
    return a, b, rate_ours, rate_base, c


async def python_path_sandbox(session: cwa.Session) -> cwa.Sandbox:
    """A sandbox of ``session`` whose commands fork PID 1 (the pure-Python path): its template is
    started with ``CWSANDBOX_LOCAL_SPAWNER=python``."""
    old = os.environ.get(_native.ENV)
    os.environ[_native.ENV] = "python"
    try:
        return await session.sandbox()
    finally:
        if old is None:
            del os.environ[_native.ENV]
        else:
            os.environ[_native.ENV] = old


async def exec_cpu(session: cwa.Session, sb: cwa.Sandbox, n: int) -> dict[str, float] | None:
    """CPU per sequential ``exec(["true"])`` on a warm sandbox, ms: the driver (this process, every
    thread), PID 1 (``schedstat``) and the command's process (the sandbox cgroup's ``cpuacct.usage``
    less PID 1's); None where the sandbox has no cpuacct group."""
    box = session.backend._boxes[sb.sandbox_id]  # type: ignore[attr-defined]
    usage = box.cgroup.cpu_usage if box.cgroup is not None else None
    if usage is None or box.pid is None:
        return None
    d0, p0, s0 = self_ns(), task_ns(box.pid), read_ns(usage)
    for _ in range(n):
        await sb.exec(["true"])
    d1, p1, s1 = self_ns(), task_ns(box.pid), read_ns(usage)
    out = {"driver": (d1 - d0) / n / 1e6, "pid1": (p1 - p0) / n / 1e6, "command": ((s1 - s0) - (p1 - p0)) / n / 1e6}
    out["total"] = sum(out.values())
    return {k: round(v, 3) for k, v in out.items()}


async def host_cpu(n: int) -> dict[str, float]:
    """CPU per sequential host ``true`` (``asyncio.create_subprocess_exec``), ms: this process (every
    thread: the event loop, asyncio's child watcher) and the child (``RUSAGE_CHILDREN``)."""
    k0, d0 = children_cpu_ns(), self_ns()
    for _ in range(n):
        await host_run(["true"])
    k1, d1 = children_cpu_ns(), self_ns()
    out = {"driver": (d1 - d0) / n / 1e6, "command": (k1 - k0) / n / 1e6}
    out["total"] = sum(out.values())
    return {k: round(v, 3) for k, v in out.items()}


def children_cpu_ns() -> int:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((r.ru_utime + r.ru_stime) * 1e9)


def uses_spawner(session: cwa.Session, sb: cwa.Sandbox) -> bool:
    box = session.backend._boxes[sb.sandbox_id]  # type: ignore[attr-defined]
    return bool((box.runner.channel.hello or {}).get("spawner"))


def ms(stats: dict[str, float]) -> dict[str, float]:
    return {k: (round(v * 1000, 3) if k != "n" else v) for k, v in stats.items()}


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n_true = 100 if args.quick else 600
    n_py = 20 if args.quick else 120
    n_create = 10 if args.quick else 60
    python3 = shutil.which("python3", path=SANDBOX_PATH) or "python3"
    results: dict[str, Any] = {"python3": python3, "quick": args.quick}
    headline: dict[str, float] = {}
    defaults = cwa.SandboxDefaults(tags=("bench:exec",))
    async with (
        cwa.Session(defaults, backend="local") as session,
        cwa.Session(defaults, backend="local") as py_session,
    ):
        sb = await session.sandbox()
        sb_py = await python_path_sandbox(py_session)
        results["isolation"] = session.backend.isolation
        results["spawner"] = {"sandbox": uses_spawner(session, sb), "python_path": uses_spawner(py_session, sb_py)}
        print(f"native spawner: {results['spawner']}", flush=True)
        for _ in range(10):  # warm-up
            await sb.exec(["true"])
            await sb_py.exec(["true"])
            await host_run(["true"])
        n_cpu = 100 if args.quick else 400
        cpu: dict[str, Any] = {"execs": n_cpu, "sandbox": [], "python_path": [], "host": []}
        for _ in range(3):  # alternating blocks, each a third
            cpu["sandbox"].append(await exec_cpu(session, sb, n_cpu // 3))
            cpu["python_path"].append(await exec_cpu(py_session, sb_py, n_cpu // 3))
            cpu["host"].append(await host_cpu(n_cpu // 3))
        for key in ("sandbox", "python_path", "host"):
            blocks = [b for b in cpu[key] if b]
            cpu[key] = {k: round(sum(b[k] for b in blocks) / len(blocks), 3) for k in blocks[0]} if blocks else None
        results["cpu_per_exec_ms"] = cpu
        if cpu["sandbox"] and cpu["python_path"]:
            headline["exec cpu vs host"] = round(cpu["sandbox"]["total"] / cpu["host"]["total"], 3)
            headline["exec cpu python path vs host"] = round(cpu["python_path"]["total"] / cpu["host"]["total"], 3)
        print(f"CPU per exec of `true`, ms: {cpu}", flush=True)
        cases = [
            ("true", ["true"], n_true),
            ("python3 -c pass", [python3, "-c", "pass"], n_py),
        ]
        for name, argv, n in cases:
            for conc in (1, 8):
                a, b, rate_a, rate_b, c = await paired(
                    lambda argv=argv: sb.exec(argv),
                    lambda argv=argv: host_run(argv),
                    n,
                    conc,
                    also=lambda argv=argv: sb_py.exec(argv),
                )
                sa, sb_, sc_ = summary(a), summary(b), summary(c)
                key = f"{name} c={conc}"
                results[key] = {
                    "sandbox_ms": ms(sa),
                    "host_ms": ms(sb_),
                    "ratio_p50": sa["p50"] / sb_["p50"],
                    "ratio_p99": sa["p99"] / sb_["p99"],
                    "sandbox_ops_per_s": rate_a,
                    "host_ops_per_s": rate_b,
                    "python_path_ms": ms(sc_),
                    "python_path_ratio_p50": sc_["p50"] / sb_["p50"],
                    "python_path_ratio_p99": sc_["p99"] / sb_["p99"],
                }
                headline[f"{name} c={conc} ratio p50"] = round(sa["p50"] / sb_["p50"], 3)
                headline[f"{name} c={conc} python path ratio p50"] = round(sc_["p50"] / sb_["p50"], 3)
                print(
                    f"{key:24s} sandbox p50 {sa['p50'] * 1e3:7.2f} ms p99 {sa['p99'] * 1e3:7.2f} ms | "
                    f"host p50 {sb_['p50'] * 1e3:7.2f} ms p99 {sb_['p99'] * 1e3:7.2f} ms | "
                    f"ratio p50 {sa['p50'] / sb_['p50']:.2f} p99 {sa['p99'] / sb_['p99']:.2f} | "
                    f"python path p50 {sc_['p50'] * 1e3:7.2f} ms ratio {sc_['p50'] / sb_['p50']:.2f} "
                    f"p99 {sc_['p99'] / sb_['p99']:.2f}",
                    flush=True,
                )
        a, b, _, _, _ = await paired(lambda: sb.run_python("pass"), lambda: host_run([python3, "-c", "pass"]), n_py, 1)
        sa, sb_ = summary(a), summary(b)
        results["run_python pass vs host python3 -c pass"] = {
            "sandbox_ms": ms(sa),
            "host_ms": ms(sb_),
            "ratio_p50": sa["p50"] / sb_["p50"],
        }
        headline["run_python ratio p50"] = round(sa["p50"] / sb_["p50"], 3)
        print(
            f"{'run_python(pass)':24s} sandbox p50 {sa['p50'] * 1e3:7.2f} ms | host python3 -c pass p50 "
            f"{sb_['p50'] * 1e3:7.2f} ms | ratio {sa['p50'] / sb_['p50']:.3f}",
            flush=True,
        )
        creates: list[float] = []
        for _ in range(n_create):
            start = time.perf_counter()
            box = await session.sandbox()
            creates.append(time.perf_counter() - start)
            await box.stop()
        sc = summary(creates)
        results["create"] = ms(sc)
        headline["create p50 ms"] = round(sc["p50"] * 1000, 2)
        headline["create p99 ms"] = round(sc["p99"] * 1000, 2)
        print(f"{'create':24s} p50 {sc['p50'] * 1e3:7.2f} ms p99 {sc['p99'] * 1e3:7.2f} ms", flush=True)
    results["headline"] = headline
    path = write_json("exec", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    anyio.run(main)
