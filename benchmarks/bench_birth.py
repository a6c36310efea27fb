"""Sandbox creation on the local backend versus the kernel's floor for a fresh sandbox, in one run.

The baseline is what any fresh sandbox must pay at least: a small preloaded Python process forks,
the child enters new user, mount, uts, ipc, pid and net namespaces (``unshare(2)``) and forks the
first process of its new pid namespace, which reports back over a pipe. It runs in a helper
process started once (``python3 -I -S``, as the sandbox's own interpreter), timed inside the helper.
``ours`` is ``Session.sandbox()`` until the sandbox is ready to run commands (the whole library
path: cgroups, registry, birth from the template, the agent's hello), each sandbox stopped after
(not timed). The two alternate, one of each per round, so both see the same machine load.

    python -m benchmarks.bench_birth [--quick]
    CWSANDBOX_LOCAL_SPAWNER=python python -m benchmarks.bench_birth   # the pure-Python exec path

Also prints where a birth's time goes (``STEPS``: medians of the time between consecutive
``time.monotonic()`` stamps, the driver's from ``_runners/born`` and the sandbox's from its hello; the
driver's cgroup and registry work runs beside the template's fork).
Then the CPU of whole lifecycles (create, ``exec(["true"])``, stop), summed over every process they
run in, against the floor's lifecycle (the same fork + unshare, whose first child forks and execs
``true``), alternating: this process joins a cpuacct group of its own before the session starts, so
the template and every sandbox cgroup are counted in it; the floor's helper is in a sibling group.
Split by process: the driver (``getrusage``, minus our own readings), the template and PID 1
(``schedstat``; PID 1 is the template's one fork, so its figure covers the whole birth), the exec
child's share (the sandbox cgroup's ``cpuacct.usage`` over the exec, less PID 1's own), and the rest
(PID 1's death); PID 1's share is split at its hello, so what serving the exec costs it shows apart,
and the exec's CPU (PID 1 serving it + its child) is set against a plain host spawn of ``true``
(fork + execve + wait, in the floor's helper, same run). Skipped where there is no writable cgroup v1 cpuacct hierarchy.
Writes ``benchmarks/out/birth.json`` (headline: ``create_p50_ratio``, ``create_p99_ratio``,
``lifecycle_cpu_ms``, ``lifecycle_cpu_ratio``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import cwsandbox_async as cwa

from ._common import parse_args, percentile, write_json
from ._cpu import AcctGroup, children_ns, read_ns, self_ns, task_ns

#: The floor: fork, unshare all namespaces, first child in the new pid namespace (timed inside).
BASELINE = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
FLAGS = 0x10000000 | 0x20000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000  # user mnt uts ipc pid net
TRUE = "/usr/bin/true" if os.path.exists("/usr/bin/true") else "/bin/true"
for line in sys.stdin:
    if line.startswith("h"):  # a host spawn of `true` (fork + execve, waited), as subprocess does
        t = time.perf_counter()
        kid = os.fork()
        if kid == 0:
            os.execv(TRUE, [TRUE])
        os.waitpid(kid, 0)
        sys.stdout.write(f"{time.perf_counter() - t}\n")
        sys.stdout.flush()
        continue
    exec_one = line.startswith("l")  # a lifecycle: the first child also runs `true` (fork + execve, waited)
    r, w = os.pipe()
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        if libc.unshare(FLAGS) != 0:
            os._exit(1)
        if os.fork() == 0:
            if exec_one:
                kid = os.fork()
                if kid == 0:
                    os.execv(TRUE, [TRUE])
                os.waitpid(kid, 0)
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

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def __aenter__(self) -> Baseline:
        self.proc = await asyncio.create_subprocess_exec(
            self.python, "-I", "-S", "-c", BASELINE, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        await self.proc.wait()

    async def once(self, lifecycle: bool = False, host_true: bool = False) -> float:
        """One birth (``lifecycle``: with one exec of ``true`` in the new PID 1; ``host_true``: no birth,
        a plain fork + execve of ``true``); its wall time."""
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"host\n" if host_true else b"life\n" if lifecycle else b"go\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the baseline helper died (can this user create namespaces?)")
        return float(line)


#: (name, from stamp, to stamp) of a birth's steps; "d:" stamps are the driver's, "s:" the sandbox's.
STEPS = (
    ("driver asks the template to fork", "d:start", "d:fork_sent"),
    ("template forks the newborn, PID 1 of its pid namespace", "d:fork_sent", "s:c_forked"),
    ("driver: registry, cgroups, their fds (thread)", "d:start", "d:prepared"),
    ("newborn waits for its configuration", "s:c_forked", "s:c_configured"),
    ("newborn: namespaces, its /proc, its uid and id maps", "s:c_configured", "s:c_entered"),
    ("newborn: its cgroups' fds awaited, joined", "s:c_entered", "s:c_joined"),
    ("PID 1: born record, mounts, hostname, read-only root", "s:c_joined", "s:g_mounted"),
    ("PID 1: capabilities, keyring, seccomp", "s:g_mounted", "s:hardened"),
    ("PID 1: its loop, hello sent", "s:hardened", "s:hello"),
    ("hello reaches the driver", "s:hello", "d:hello"),
    ("driver: ready", "d:hello", "d:running"),
    ("total", "d:start", "d:running"),
)


def birth_stamps(session: cwa.Session, sb: cwa.Sandbox) -> dict[str, float]:
    """The driver's and the sandbox's stamps of one birth (a peek into the local backend)."""
    box = session.backend._boxes[sb.sandbox_id]  # type: ignore[attr-defined]
    hello = (box.runner.channel.hello or {}).get("stamps") or {}
    return {**{f"d:{k}": v for k, v in box.runner.stamps.items()}, **{f"s:{k}": v for k, v in hello.items()}}


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


#: Where a lifecycle's CPU goes (keys of ``cpu_per_lifecycle_ms``), in the order printed.
CPU_PARTS = (
    ("driver", "driver (this process: event loop, worker threads; our own readings subtracted)"),
    ("template", "template: its own CPU"),
    ("pid1_birth", "sandbox PID 1 from the template's fork until its hello (namespaces, cgroups, mounts, hardening)"),
    ("pid1_exec", "sandbox PID 1 serving the exec (the order, the fork or spawn, the reap, the report)"),
    ("exec_child", "exec child (from PID 1's fork or spawn until `true` exits)"),
    ("rest", "rest: PID 1's death after SIGKILL (its address space torn down)"),
)


def template_pids() -> list[int]:
    """The template's processes: those under this process whose command line carries the template's
    marker, taken while no sandbox is alive (sandbox processes are forks of the template and carry it too)."""
    from ._procstat import tree

    found = []
    for pid, _ in tree(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"cwsandbox-template" in f.read():
                    found.append(pid)
        except OSError:
            continue
    if not found:
        raise RuntimeError("no template process found under this process")
    return found


async def cpu_blocks(
    session: cwa.Session, baseline: Baseline, floor: AcctGroup, ours: AcctGroup, n: int
) -> dict[str, Any]:
    """CPU of ``n`` lifecycles (create, ``exec(["true"])``, stop) and of ``n`` floor lifecycles, alternating.

    ``ours`` holds this process, the template and (as children) every sandbox cgroup; ``floor`` holds
    the baseline helper. The per-sandbox figures are read just before ``stop``, which removes the groups."""
    backend: Any = session.backend
    tpids = template_pids()
    parts = dict.fromkeys((k for k, _ in CPU_PARTS), 0)
    reading = 0  # this thread's CPU spent reading counters, taken out of the driver's share
    ours_total = floor_total = floor_self = 0
    tkids = host_true = 0
    for _ in range(n):
        r0 = time.thread_time_ns()
        u0, d0, t0, c0 = ours.usage(), self_ns(), sum(map(task_ns, tpids)), sum(map(children_ns, tpids))
        reading += time.thread_time_ns() - r0
        sb = await session.sandbox()
        r0 = time.thread_time_ns()
        box = backend._boxes[sb.sandbox_id]
        cpu_file = box.cgroup.cpu_usage
        s0, p0 = read_ns(cpu_file), task_ns(box.pid)
        reading += time.thread_time_ns() - r0
        result = await sb.exec(["true"])
        assert result.returncode == 0
        r0 = time.thread_time_ns()
        s1, p1 = read_ns(cpu_file), task_ns(box.pid)
        reading += time.thread_time_ns() - r0
        await sb.stop()
        r0 = time.thread_time_ns()
        u1, d1, t1, c1 = ours.usage(), self_ns(), sum(map(task_ns, tpids)), sum(map(children_ns, tpids))
        reading += time.thread_time_ns() - r0
        ours_total += u1 - u0
        parts["driver"] += d1 - d0
        parts["template"] += t1 - t0
        parts["pid1_birth"] += p0
        parts["pid1_exec"] += p1 - p0
        parts["exec_child"] += (s1 - s0) - (p1 - p0)
        tkids += c1 - c0
        f0, h0 = floor.usage(), task_ns(baseline.pid)
        await baseline.once(lifecycle=True)
        floor_total += floor.usage() - f0
        floor_self += task_ns(baseline.pid) - h0
        f0 = floor.usage()
        await baseline.once(host_true=True)
        host_true += floor.usage() - f0
    parts["driver"] -= reading
    ours_total -= reading
    parts["rest"] = ours_total - sum(v for k, v in parts.items() if k != "rest")

    def ms(ns: float) -> float:
        return round(ns / n / 1e6, 3)

    return {
        "lifecycles": n,
        "what": "CPU per lifecycle (create, exec of `true`, stop), summed over every process, ms",
        "cpu_per_lifecycle_ms": {k: ms(v) for k, v in parts.items()},
        "cpu_total_ms": ms(ours_total),
        "cpu_without_driver_ms": ms(ours_total - parts["driver"]),
        "template_reaped_children_ms": ms(tkids),
        "floor": {
            "what": "fork + unshare(user, mnt, uts, ipc, pid, net) + first child, which forks + execs `true` and waits",
            "cpu_total_ms": ms(floor_total),
            "helper_ms": ms(floor_self),
            "children_ms": ms(floor_total - floor_self),
        },
        "host_true": {
            "what": "a host spawn of `true` (fork + execve + wait) from the same small interpreter",
            "cpu_ms": ms(host_true),
        },
        "exec_cpu_ms": ms(parts["pid1_exec"] + parts["exec_child"]),
        "exec_vs_host_true": round((parts["pid1_exec"] + parts["exec_child"]) / host_true, 2) if host_true else None,
        "ratio_total": round(ours_total / floor_total, 2) if floor_total else None,
        "ratio_without_driver": round((ours_total - parts["driver"]) / floor_total, 2) if floor_total else None,
    }


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds = 40 if args.quick else 300
    cpu_rounds = 30 if args.quick else 200
    top = AcctGroup.make(f"cwsandbox-bench-{os.getpid()}")
    ours_group = floor_group = None
    if top is not None:
        ours_group, floor_group = top.child("ours"), top.child("floor")
        ours_group.join(os.getpid())  # before the session: the template and every sandbox group land in it
    try:
        result = await measure(rounds, cpu_rounds, ours_group, floor_group)
    finally:
        if top is not None:
            top.remove()
    path = write_json("birth", result)
    print(f"create       {result['create_ms']}")
    print(f"baseline     {result['baseline_ms']}")
    for name, value in result["steps_p50_ms"].items():
        print(f"  {name:48s} p50 {value:7.3f} ms")
    cpu = result.get("cpu")
    if cpu:
        print(f"CPU per lifecycle (create, exec `true`, stop), mean of {cpu['lifecycles']}:")
        for key, label in CPU_PARTS:
            print(f"  {label:92s} {cpu['cpu_per_lifecycle_ms'][key]:7.3f} ms")
        print(f"  {'total':92s} {cpu['cpu_total_ms']:7.3f} ms")
        print(f"  {'floor: ' + cpu['floor']['what']:92s} {cpu['floor']['cpu_total_ms']:7.3f} ms")
        print(f"  ratio {cpu['ratio_total']} (without the driver {cpu['ratio_without_driver']})")
        print(
            f"  the exec inside (PID 1 serving it + its child) {cpu['exec_cpu_ms']} ms vs a host spawn of `true` "
            f"{cpu['host_true']['cpu_ms']} ms: {cpu['exec_vs_host_true']}x"
        )
    print(f"native spawner {result['native_spawner']} (CWSANDBOX_LOCAL_SPAWNER=python: the fork of PID 1)")
    print(f"ratios       {result['headline']}  (load {result['load_average']})  -> {path}")


async def measure(
    rounds: int, cpu_rounds: int, ours_group: AcctGroup | None, floor_group: AcctGroup | None
) -> dict[str, Any]:
    async with cwa.Session(backend="local", handle_signals=False) as session:
        python = session.backend._machine.python  # type: ignore[attr-defined]  # the sandbox's own interpreter
        first = await session.sandbox()  # the template starts here, once: not timed
        box = session.backend._boxes[first.sandbox_id]  # type: ignore[attr-defined]
        spawner = bool((box.runner.channel.hello or {}).get("spawner"))  # commands through the native spawner
        await first.stop()
        ours: list[float] = []
        base: list[float] = []
        stamps: list[dict[str, float]] = []
        async with Baseline(python) as baseline:
            if floor_group is not None:
                floor_group.join(baseline.pid)
            for _ in range(5):  # warm-up
                await baseline.once()
                await baseline.once(lifecycle=True)
            for _ in range(rounds):
                t = time.perf_counter()
                sb = await session.sandbox()
                ours.append(time.perf_counter() - t)
                stamps.append(birth_stamps(session, sb))
                await sb.stop()
                base.append(await baseline.once())
            cpu = None
            if ours_group is not None and floor_group is not None:
                cpu = await cpu_blocks(session, baseline, floor_group, ours_group, cpu_rounds)
    load = os.getloadavg()
    headline: dict[str, Any] = {
        "create_p50_ratio": round(percentile(ours, 50) / percentile(base, 50), 2),
        "create_p99_ratio": round(percentile(ours, 99) / percentile(base, 99), 2),
    }
    if cpu is not None:
        headline["lifecycle_cpu_ms"] = cpu["cpu_total_ms"]
        headline["lifecycle_cpu_ratio"] = cpu["ratio_total"]
        headline["exec_cpu_vs_host_true"] = cpu["exec_vs_host_true"]
    return {
        "what": "Session.sandbox() until ready vs fork + unshare(user, mnt, uts, ipc, pid, net) + first child",
        "native_spawner": spawner,
        "load_average": [round(x, 2) for x in load],
        "create_ms": stats_ms(ours),
        "baseline_ms": stats_ms(base),
        "steps_p50_ms": breakdown(stamps),
        "cpu": cpu or {"skipped": "no writable cgroup v1 cpuacct hierarchy"},
        "headline": headline,
    }


if __name__ == "__main__":
    asyncio.run(main())
