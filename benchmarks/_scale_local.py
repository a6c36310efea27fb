"""bench_scale, part 1: N live local sandboxes at once (see ``bench_scale``'s docstring)."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import _threads as local_threads
from cwsandbox_async.backends.local._bwrap import SANDBOX_PATH

from . import _procstat as ps
from ._common import summary

#: Sandboxes created at once (the rest wait for a slot).
CREATE_LIMIT = 16
#: Execs and stops in flight at once.
EXEC_LIMIT = 64
#: Seconds to let every sandbox settle (pages touched) before measuring.
SETTLE_SECONDS = 2.0
#: A bare interpreter that says it is up, then idles until its stdin closes.
READY = "import sys;sys.stdout.write('r');sys.stdout.flush();sys.stdin.read()"
#: Depth in a sandbox's process tree -> role (the agent is the sandbox's PID 1, born from the template).
ROLES = {0: "agent", 1: "commands", 2: "their children"}


def ms(stats: dict[str, float]) -> dict[str, float]:
    return {k: (round(v * 1000, 2) if k != "n" else v) for k, v in stats.items()}


def system() -> dict[str, int]:
    """What the driver and the kernel hold right now (kB, counts)."""
    info = ps.meminfo()
    return {
        "fds": ps.fd_count(),
        "threads": ps.thread_count(),
        "driver_rss_kb": ps.self_rss_kb(),
        "mem_available_kb": info["MemAvailable"],
        "page_tables_kb": info.get("PageTables", 0),
        "kernel_stack_kb": info.get("KernelStack", 0),
        "slab_unreclaimable_kb": info.get("SUnreclaim", 0),
    }


def delta_per(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    """Per-unit growth; memory in MiB. System-wide figures include other processes' noise."""
    out: dict[str, float] = {}
    for key in before:
        d = after[key] - before[key]
        if key.endswith("_kb"):
            out[key.removesuffix("_kb") + "_mib"] = round(d / 1024 / n, 3)
        else:
            out[key] = round(d / n, 3)
    out["mem_available_drop_mib"] = -out.pop("mem_available_mib")
    return out


def memory_report(totals: ps.MemTotals, n: int) -> dict[str, Any]:
    roles: dict[str, Any] = {}
    for depth, kb in sorted(totals.by_depth.items()):
        name = ROLES.get(depth, f"depth {depth}")
        roles[name] = {
            "processes_per_sandbox": round(kb["processes"] / n, 3),
            "pss_mib": round(kb["Pss"] / 1024 / n, 3),
            "uss_mib": round((kb["Private_Clean"] + kb["Private_Dirty"]) / 1024 / n, 3),
            "rss_mib": round(kb["Rss"] / 1024 / n, 3),
            "names": sorted(totals.names.get(depth, ())),
        }
    return {**totals.per(n), "by_role": roles}


async def host_baseline(python3: str, n: int) -> dict[str, Any]:
    """``n`` bare ``python3 -I -S`` processes started ``CREATE_LIMIT`` at a time, then idle."""
    procs: list[asyncio.subprocess.Process] = []
    latencies: list[float] = []
    limiter = anyio.CapacityLimiter(CREATE_LIMIT)

    async def start() -> None:
        async with limiter:
            t = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                python3, "-I", "-S", "-c", READY, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )
            procs.append(proc)
            assert proc.stdout is not None
            await proc.stdout.readexactly(1)
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    try:
        with anyio.fail_after(300):
            async with anyio.create_task_group() as tg:
                for _ in range(n):
                    tg.start_soon(start)
        elapsed = time.perf_counter() - t0
        await anyio.sleep(SETTLE_SECONDS / 2)
        totals = await anyio.to_thread.run_sync(ps.measure_trees, [p.pid for p in procs])
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(60):
            for p in procs:
                if p.stdin is not None:
                    p.stdin.close()
            for p in procs:
                await p.wait()
    return {
        "n": n,
        "create_per_s": round(n / elapsed, 1),
        "start_ms": ms(summary(latencies)),
        "memory": memory_report(totals, n),
    }


def roots_of(session: cwa.Session, sandboxes: list[cwa.Sandbox]) -> tuple[list[int], list[str]]:
    """The root pid (the agent) and cgroup directories of each sandbox (a peek into the local backend)."""
    boxes = getattr(session.backend, "_boxes", {})
    pids: list[int] = []
    cgroups: list[str] = []
    for sb in sandboxes:
        box = boxes.get(sb.sandbox_id)
        if box is None or box.pid is None:
            continue
        pids.append(box.pid)
        if box.cgroup is not None:
            cgroups.extend(box.cgroup.paths)
    return pids, cgroups


def live_processes(roots: list[int]) -> list[tuple[int, int | None]]:
    return [(pid, ps.start_time(pid)) for root in roots for pid, _ in ps.tree(root)]


async def wait_until(check: Callable[[], bool], seconds: float) -> bool:
    """Poll ``check`` (the state of /proc: nothing to wait on) until true or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        await anyio.sleep(0.1)


def existing(paths: list[str]) -> list[str]:
    return [p for p in paths if os.path.exists(p)]


async def timed_gather(
    work: list[Callable[[], Awaitable[Any]]], limit: int
) -> tuple[list[cwa.Outcome[Any]], float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    outcomes = await cwa.gather(work, limit=limit, progress=False)
    return outcomes, time.perf_counter() - wall, time.process_time() - cpu


def rate_by_chunk(times: list[float], step: int) -> list[float]:
    """Completions per second within each run of ``step`` completions (shows a rate that decays with N)."""
    times = sorted(times)
    out = []
    for i in range(0, len(times) - step + 1, step):
        start = times[i - 1] if i else 0.0
        out.append(round(step / max(times[i + step - 1] - start, 1e-9), 1))
    return out


def failures(outcomes: list[cwa.Outcome[Any]]) -> dict[str, Any]:
    bad = [o for o in outcomes if not o.ok]
    return {"count": len(bad), "first": [repr(o.error)[:300] for o in bad[:5]]}


def use_pidfd_watcher() -> str:
    """On Python < 3.12, replace asyncio's ThreadedChildWatcher (a thread per child) with PidfdChildWatcher."""
    if sys.version_info >= (3, 12):
        return "default (pidfd on 3.12+)"
    watcher = asyncio.PidfdChildWatcher()
    asyncio.set_child_watcher(watcher)
    watcher.attach_loop(asyncio.get_running_loop())
    return "PidfdChildWatcher"


async def local_scale(n: int, watcher: str = "default") -> dict[str, Any]:
    if watcher == "pidfd":
        watcher = use_pidfd_watcher()
    python3 = shutil.which("python3", path=SANDBOX_PATH) or "python3"
    print(
        f"host baseline: {min(n, 200)} bare `{python3} -I -S` processes, {CREATE_LIMIT} started at a time", flush=True
    )
    host = await host_baseline(python3, min(n, 200))
    print(
        f"  {host['create_per_s']:.1f} started/s; PSS {host['memory']['pss_mib']:.2f} MiB, "
        f"USS {host['memory']['uss_mib']:.2f} MiB, RSS {host['memory']['rss_mib']:.2f} MiB per process",
        flush=True,
    )
    gc.collect()
    await anyio.sleep(0.5)
    base = system()
    out: dict[str, Any] = {
        "n": n,
        "create_limit": CREATE_LIMIT,
        "host_baseline": host,
        "python3": python3,
        "child_watcher": watcher,
    }
    defaults = cwa.SandboxDefaults(tags=("bench:scale",), create_timeout_seconds=300.0)
    async with cwa.Session(defaults, backend="local") as session:
        backend = session.backend
        out["isolation"] = backend.isolation
        print(f"creating {n} local sandboxes ({backend.isolation}), {CREATE_LIMIT} at a time", flush=True)
        done_at: list[float] = []
        t0 = time.perf_counter()

        async def create() -> cwa.Sandbox:
            sb = await session.create_sandbox()
            done_at.append(time.perf_counter() - t0)
            return sb

        created, wall, cpu = await timed_gather([create] * n, CREATE_LIMIT)
        chunk = max(n // 10, 4 * CREATE_LIMIT)
        sandboxes: list[cwa.Sandbox] = [o.value for o in created if o.ok and o.value is not None]
        out["create"] = {
            "ok": len(sandboxes),
            "failures": failures(created),
            "wall_s": round(wall, 2),
            "per_s": round(len(sandboxes) / wall, 1),
            "driver_cpu_ms_per_sandbox": round(cpu / n * 1000, 3),
            "latency_ms": ms(summary([o.duration for o in created if o.ok])),
            "per_s_by_chunk": rate_by_chunk(done_at, chunk),
            "chunk": chunk,
            "completed_at_s": [round(t, 3) for t in sorted(done_at)],
            "limits_enforced_by": dict(getattr(backend, "limits", {})),
        }
        print(
            f"  {len(sandboxes)}/{n} alive in {wall:.1f} s: {len(sandboxes) / wall:.1f}/s "
            f"(bare python: {host['create_per_s']:.1f}/s), failures {n - len(sandboxes)}; "
            f"per {chunk}: {out['create']['per_s_by_chunk']}",
            flush=True,
        )
        await anyio.sleep(SETTLE_SECONDS)
        roots, cgroups = roots_of(session, sandboxes)
        k = max(len(sandboxes), 1)
        idle = memory_report(await anyio.to_thread.run_sync(ps.measure_trees, roots), k)
        alive = system()
        out["idle"] = {"memory": idle, "system_per_sandbox": delta_per(base, alive, k), "driver": alive}
        print(
            f"  idle, per sandbox: PSS {idle['pss_mib']:.2f} MiB (USS {idle['uss_mib']:.2f}, "
            f"RSS {idle['rss_mib']:.2f}) over {idle['processes']:.2f} processes; by role: "
            + ", ".join(f"{r} {v['pss_mib']:.2f}" for r, v in idle["by_role"].items()),
            flush=True,
        )
        sysd = out["idle"]["system_per_sandbox"]
        print(
            f"  driver: +{sysd['driver_rss_mib'] * 1024:.0f} KiB RSS, +{sysd['threads']:.2f} threads, "
            f"+{sysd['fds']:.2f} fds per sandbox ({alive['threads']} threads, {alive['fds']} fds); kernel: "
            f"page tables {sysd['page_tables_mib'] * 1024:.0f} KiB, stacks {sysd['kernel_stack_mib'] * 1024:.0f} KiB, "
            f"slab {sysd['slab_unreclaimable_mib'] * 1024:.0f} KiB; MemAvailable -{sysd['mem_available_drop_mib']:.2f} "
            "MiB per sandbox (system-wide)",
            flush=True,
        )

        print(f"exec(['true']) in each of the {len(sandboxes)} sandboxes, twice, {EXEC_LIMIT} at a time", flush=True)
        work: list[Callable[[], Awaitable[Any]]] = [functools.partial(sb.exec, ["true"]) for sb in sandboxes]
        for key, what in (("exec", "first exec"), ("exec_again", "second exec")):
            execs, wall, cpu = await timed_gather(work, EXEC_LIMIT)
            bad_rc = sum(1 for o in execs if o.ok and o.value is not None and o.value.returncode != 0)
            out[key] = {
                "ok": sum(1 for o in execs if o.ok) - bad_rc,
                "failures": failures(execs),
                "nonzero_exit": bad_rc,
                "wall_s": round(wall, 2),
                "per_s": round(len(execs) / wall, 1),
                "latency_ms": ms(summary([o.duration for o in execs if o.ok])),
                "driver_cpu_ms_per_exec": round(cpu / max(len(execs), 1) * 1000, 3),
            }
            print(
                f"  {what}: {out[key]['ok']}/{len(sandboxes)} ok in {wall:.2f} s ({out[key]['per_s']:.0f}/s), "
                f"p50 {out[key]['latency_ms']['p50']:.1f} ms p99 {out[key]['latency_ms']['p99']:.1f} ms",
                flush=True,
            )
        await anyio.sleep(SETTLE_SECONDS)
        soon = memory_report(await anyio.to_thread.run_sync(ps.measure_trees, roots), k)
        out["after_exec"] = {"memory_soon": soon}
        for label, m in ((f"{SETTLE_SECONDS:.0f} s after", soon),):
            print(
                f"  {label} the execs, per sandbox: PSS {m['pss_mib']:.2f} MiB over {m['processes']:.2f} processes; "
                "by role: " + ", ".join(f"{r} {v['pss_mib']:.2f}" for r, v in m["by_role"].items()),
                flush=True,
            )

        procs = live_processes(roots)
        registry = getattr(getattr(backend, "_machine", None), "registry", None)
        print(f"stopping {len(sandboxes)} sandboxes, {EXEC_LIMIT} at a time", flush=True)
        stops, wall, cpu = await timed_gather([sb.stop for sb in sandboxes], EXEC_LIMIT)
        out["stop"] = {
            "failures": failures(stops),
            "wall_s": round(wall, 2),
            "per_s": round(len(stops) / wall, 1),
            "latency_ms": ms(summary([o.duration for o in stops if o.ok])),
        }
        print(f"  stopped in {wall:.2f} s ({out['stop']['per_s']:.0f}/s)", flush=True)
        session_id = session.session_id

    def processes_gone() -> bool:
        return all(ps.start_time(pid) != start for pid, start in procs)

    gone = await wait_until(processes_gone, 10)
    # anyio keeps its idle worker threads (the backend uses at most THREADS at once) until the event
    # loop ends; anything past those is a leak.
    idle_pool = local_threads.THREADS
    back = await wait_until(
        lambda: ps.fd_count() <= base["fds"] and ps.thread_count() <= base["threads"] + idle_pool, 10
    )
    left_registry = []
    if registry is not None:
        left_registry = [e for e in registry.read_all() if e.get("session_id") == session_id]
    end = system()
    out["teardown"] = {
        "processes_checked": len(procs),
        "processes_left": sum(1 for pid, start in procs if ps.start_time(pid) == start),
        "cgroups_left": len(existing(cgroups)),
        "registry_left": len(left_registry),
        "fds": {"baseline": base["fds"], "end": end["fds"]},
        "threads": {"baseline": base["threads"], "end": end["threads"]},
        "clean": gone and back and not left_registry and not existing(cgroups),
    }
    print(f"  teardown: {out['teardown']}", flush=True)
    pss = idle["pss_mib"]
    out["headline"] = {
        "local sandboxes alive": len(sandboxes),
        "local create failures": n - len(sandboxes),
        "local creates/s": out["create"]["per_s"],
        "local creates/s vs bare python": round(out["create"]["per_s"] / host["create_per_s"], 3),
        "idle PSS MiB/sandbox": pss,
        "idle PSS vs bare python": round(pss / host["memory"]["pss_mib"], 3),
        "PSS MiB/sandbox after its execs": soon["pss_mib"],
        "driver threads at peak": alive["threads"],
        "exec ok": out["exec"]["ok"],
        "exec ok (second round)": out["exec_again"]["ok"],
        "teardown clean": out["teardown"]["clean"],
    }
    return out
