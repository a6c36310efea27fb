"""Per-sandbox cgroups (v1 or v2): created by the backend, limited, and removed on destroy.

The backend only ever writes to groups it created itself, named ``cwsandbox_async-<sandbox id>``
(with children ``agent``/``cmd``), placed under the cgroup this process is in (so the parent's own
limits keep applying), or under ``cgroup_parent`` when given. It never changes a group it did not
create: on v2 it uses a parent only if the controllers it needs are already enabled in that
parent's ``cgroup.subtree_control``.

Every sandbox gets a group in each usable controller, whatever its limits:

- **cpu**: always, so sandboxes share the CPU by weight, not by process count (a sandbox running 100
  busy processes gets the same share as one running 1); ``cpu.shares`` (v1) / ``cpu.weight`` (v2)
  when ``cpu_weight`` is set, else the kernel's default. Inside it the agent and the commands are
  siblings, ``S/agent`` with ``AGENT_CPU_WEIGHT`` (the highest weight) and ``S/cmd`` with the
  default: however many busy threads the commands run, they are one entity against the agent, which
  gets the sandbox's CPU first whenever it is runnable (its report cannot be delayed from inside). A
  quota (``cfs_quota_us`` / ``cpu.max``), only when ``Resources.cpu`` asks for one, is on ``S/cmd``:
  the commands cannot throttle the agent by using up the sandbox's quota. ``S``'s own weight is
  raised to ``PRIORITY_CPU_WEIGHT`` while an exec asks for CPU priority (``_priority``), by the
  driver: ``SandboxCgroup.weight_file`` and the values it takes.
- **pids**: ``pids.max`` for the whole sandbox (its machinery included).
- **cpuacct** (v1; v2's ``cpu.stat`` is always there): the CPU time of everything in the sandbox,
  read by the agent (``sandbox_cpu``) to tell a starved program from a busy one.
- **memory**: the sandbox group holds the agent, unlimited by the commands' limit; the commands run
  in the child ``cmd`` with ``Resources.memory_mib`` (swap off): a program's memory use kills the
  program, never the agent. v1: ``<memory>/S`` (agent) and ``<memory>/S/cmd``; v2, where a group
  with children cannot hold processes: ``S/agent`` and ``S/cmd``, memory and cpu enabled in ``S``'s
  subtree.

A newborn joins its groups itself (through file descriptors the driver opened), and the agent moves
each command into ``command_dirs``; /sys is read-only inside the sandbox. The newborn enters its
cgroup namespace from the sandbox's top groups (``ns_root_dirs``: ``S`` in every v1 hierarchy) and
only then joins the agent's own cpu group ``S/agent`` (``open_fds``' ``join_inside``): the namespace
is rooted at ``S``, so inside, the agent's groups read ``/`` or ``/agent`` and the commands' ``/`` or
``/cmd`` -- never a path above the root (``/../cmd`` would tell a program about the host's layout).
On v2 a group with enabled controllers holds no process, so ``S`` cannot be joined: there the
namespace is rooted at ``S/agent`` and the commands' group reads ``/../cmd`` (a known limit). Where no
controller is writable, ``CgroupManager.available`` is empty and the backend falls back to rlimits.
All calls are synchronous: the backend runs them in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field

from ..._log import log

__all__ = ["PREFIX", "PRIORITY_CPU_WEIGHT", "CgroupManager", "SandboxCgroup", "is_our_cgroup", "process_tree"]

PREFIX = "cwsandbox_async-"
CONTROLLERS = ("pids", "memory", "cpu", "cpuacct")
CPU_PERIOD_US = 100_000
#: v1 ``cpu.shares`` for the v2 default weight (100).
SHARES_PER_WEIGHT = 1024 / 100
AGENT_CHILD = "agent"
COMMAND_CHILD = "cmd"
#: The agent's CPU weight inside its sandbox (v2 ``cpu.weight``; v1 ``cpu.shares`` is this times
#: ``SHARES_PER_WEIGHT``), against the commands' default 100: the highest v2 allows.
AGENT_CPU_WEIGHT = 10_000
#: A sandbox's CPU weight while an exec has priority (``_priority``), against every other sandbox's
#: (the kernel's default 100, or ``cpu_weight``) and the host's own processes (100 each at nice 0): the
#: highest v2 allows, and the same in v1 shares (``SHARES_PER_WEIGHT``).
PRIORITY_CPU_WEIGHT = 10_000
#: The kernel's default weight of a new group (v2 ``cpu.weight``; v1 ``cpu.shares`` is 1024).
DEFAULT_CPU_WEIGHT = 100


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _shares(weight: int) -> str:
    """v1 ``cpu.shares`` for a v2 weight."""
    return str(max(2, round(weight * SHARES_PER_WEIGHT)))


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fs type, super options) of every cgroup mount."""
    out = []
    try:
        text = _read("/proc/self/mountinfo")
    except OSError:
        return []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((fields[3], fields[4], rfields[0], set(rfields[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path."""
    out: dict[str, str] = {}
    try:
        text = _read("/proc/self/cgroup")
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if not ctrls:
            out[""] = path
        for c in ctrls.split(","):
            out[c] = path
    return out


def _join(mount_root: str, mount_point: str, path: str) -> str | None:
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
        return None
    rel = path[len(mount_root) :] if mount_root != "/" else path
    return os.path.join(mount_point, rel.lstrip("/"))


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (via ``/proc/PID/task/PID/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def is_our_cgroup(path: str) -> bool:
    """True for a directory this backend could have created: under a cgroup mount, ours by name."""
    real = os.path.realpath(path)
    parent, name = os.path.split(real)
    if not name.startswith(PREFIX) and not (
        name in (AGENT_CHILD, COMMAND_CHILD) and os.path.basename(parent).startswith(PREFIX)
    ):
        return False
    return any(real.startswith(mp.rstrip("/") + "/") for _, mp, _, _ in _mounts())


@dataclass
class SandboxCgroup:
    """The groups created for one sandbox. ``paths``: all of them, children before their parents."""

    paths: list[str]
    #: Where the sandbox's first process (the agent) lives.
    agent_dirs: list[str] = field(default_factory=list)
    #: Where the newborn is when it enters its cgroup namespace (the namespace's roots, ancestors of
    #: ``agent_dirs`` and ``command_dirs``); empty: ``agent_dirs`` themselves.
    ns_root_dirs: list[str] = field(default_factory=list)
    #: Where the agent puts each command (the memory limit is here).
    command_dirs: list[str] = field(default_factory=list)
    #: The commands' OOM counters: v2 ``memory.events``, v1 ``memory.oom_control``.
    events: str | None = None
    #: CPU time of the whole sandbox: v1 ``cpuacct.usage`` (ns), v2 ``cpu.stat`` (``usage_usec``).
    cpu_usage: str | None = None
    #: The file a single-threaded process writes ``0`` into to join a group: v1 ``tasks`` (moving one
    #: thread, the kernel takes no global lock; ``cgroup.procs`` takes the threadgroup rwsem for write,
    #: which waits for an RCU grace period, 10-30 ms here, when it was idle), v2 ``cgroup.procs``.
    join_file: str = "cgroup.procs"
    enforced: dict[str, str] = field(default_factory=dict)
    #: The sandbox's CPU weight (v1 ``cpu.shares``, v2 ``cpu.weight`` of its top group; None without a
    #: cpu group), its usual value and its value while an exec has priority (see ``_priority``).
    weight_file: str | None = None
    weight_usual: str = ""
    weight_priority: str = ""
    #: Execs holding the priority now (``_priority``): the weight is raised while there is one.
    priority_holders: int = 0

    def attach(self, pid: int) -> None:
        """Move one process where commands run (the plain path); ``OSError`` if the kernel refuses."""
        for path in (*self.agent_dirs, *self.command_dirs):
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def open_fds(self) -> dict[str, list[int]]:
        """Fds for the newborn, by name: ``join`` (write-only ``join_file`` of the groups it joins
        before it enters its cgroup namespace: ``ns_root_dirs``, else ``agent_dirs``), ``join_inside``
        (the same for the agent's groups below those roots, joined from inside the namespace),
        ``cmd_procs`` (the same for the commands' groups), ``cmd_events`` (the commands' OOM counters)
        and ``sandbox_cpu`` (the sandbox's CPU time), read-only; empty lists where there are none.
        All CLOEXEC; the caller closes them. ``OSError`` on failure (nothing left open)."""
        names = ("join", "join_inside", "cmd_procs", "cmd_events", "sandbox_cpu")
        out: dict[str, list[int]] = {name: [] for name in names}
        roots = self.ns_root_dirs or self.agent_dirs
        wanted = [
            *(("join", os.path.join(p, self.join_file), os.O_WRONLY) for p in roots),
            *(("join_inside", os.path.join(p, self.join_file), os.O_WRONLY) for p in self.agent_dirs if p not in roots),
            *(("cmd_procs", os.path.join(p, self.join_file), os.O_WRONLY) for p in self.command_dirs),
            *((("cmd_events", self.events, os.O_RDONLY),) if self.events else ()),
            *((("sandbox_cpu", self.cpu_usage, os.O_RDONLY),) if self.cpu_usage else ()),
        ]
        try:
            for name, path, mode in wanted:
                out[name].append(os.open(path, mode | os.O_CLOEXEC))
        except OSError:
            for fd in (fd for fds in out.values() for fd in fds):
                os.close(fd)
            raise
        return out

    def pids(self) -> set[int]:
        out: set[int] = set()
        for path in self.paths:
            try:
                out.update(int(x) for x in _read(os.path.join(path, "cgroup.procs")).split())
            except OSError:
                continue
        return out

    def kill_all(self) -> int:
        """SIGKILL every process in the groups; returns how many were signalled."""
        victims = self.pids()
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return len(victims)

    def try_remove(self) -> bool:
        """Remove the groups that are empty (children first); True when none is left."""
        left = []
        for path in sorted(self.paths, key=lambda p: p.count("/"), reverse=True):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError:
                left.append(path)
        self.paths = left
        return not left


class CgroupManager:
    """Finds where this process may create cgroups, once; then creates one group set per sandbox."""

    def __init__(self, *, enabled: bool = True, parent: str | None = None, cpu_weight: int | None = None) -> None:
        self.version: str | None = None
        #: controller -> directory under which sandbox groups are created
        self.parents: dict[str, str] = {}
        self.cpu_weight = cpu_weight
        if enabled:
            self._detect(parent)

    @property
    def available(self) -> frozenset[str]:
        return frozenset(self.parents)

    def _detect(self, parent: str | None) -> None:
        mounts = _mounts()
        own = _own_paths()
        v1: dict[str, str] = {}
        for root, point, fstype, opts in mounts:
            if fstype != "cgroup":
                continue
            for c in CONTROLLERS:
                if c in opts and c in own and c not in v1:
                    path = _join(root, point, own[c]) if parent is None else os.path.join(point, parent.lstrip("/"))
                    if path and self._writable(path):
                        v1[c] = path
        if v1:
            self.version, self.parents = "v1", v1
            return
        for root, point, fstype, _ in mounts:
            if fstype != "cgroup2":
                continue
            if parent is not None:
                where: str | None = parent if parent.startswith(point) else os.path.join(point, parent.lstrip("/"))
            else:
                where = _join(root, point, own.get("", "/"))
            if not where or not self._writable(where):
                continue
            try:
                enabled = set(_read(os.path.join(where, "cgroup.subtree_control")).split())
            except OSError:
                continue
            found = {c: where for c in CONTROLLERS if c in enabled}
            if found:
                self.version, self.parents = "v2", found
                return

    @staticmethod
    def _writable(path: str) -> bool:
        return os.path.isdir(path) and os.access(path, os.W_OK)

    def planned(self, sandbox_id: str) -> list[str]:
        """The directories ``create`` would make for ``sandbox_id`` (for the registry, before they exist)."""
        if self.version == "v2":
            top = os.path.join(next(iter(self.parents.values())), PREFIX + sandbox_id)
            split = {"memory", "cpu"} & self.available
            kids = [os.path.join(top, c) for c in (AGENT_CHILD, COMMAND_CHILD)] if split else []
            return [*kids, top]
        tops = sorted({os.path.join(parent, PREFIX + sandbox_id) for parent in self.parents.values()})
        kids = []
        if "memory" in self.parents:
            kids.append(os.path.join(self.parents["memory"], PREFIX + sandbox_id, COMMAND_CHILD))
        if "cpu" in self.parents:
            top = os.path.join(self.parents["cpu"], PREFIX + sandbox_id)
            kids += [os.path.join(top, c) for c in (AGENT_CHILD, COMMAND_CHILD) if os.path.join(top, c) not in kids]
        return [*kids, *tops]

    def create(
        self, sandbox_id: str, *, pids: int | None, memory_bytes: int | None, cpu: float | None
    ) -> SandboxCgroup | None:
        """Create and limit the groups for one sandbox; None when no controller is usable.

        A limit that cannot be written is logged and left out of ``enforced`` (the caller then
        applies the rlimit fallback for it). ``OSError`` when a group cannot be created; groups
        created before the failure are removed.
        """
        if not self.parents:
            return None
        cg = SandboxCgroup(paths=[], join_file="tasks" if self.version == "v1" else "cgroup.procs")
        try:
            if self.version == "v2":
                self._create_v2(cg, PREFIX + sandbox_id, pids, memory_bytes, cpu)
            else:
                self._create_v1(cg, PREFIX + sandbox_id, pids, memory_bytes, cpu)
        except OSError:
            cg.try_remove()
            raise
        return cg

    def _mkdir(self, cg: SandboxCgroup, path: str) -> str:
        os.mkdir(path, 0o755)
        cg.paths.insert(0, path)  # children before parents
        return path

    def _create_v1(self, cg: SandboxCgroup, name: str, pids: int | None, memory: int | None, cpu: float | None) -> None:
        dirs: dict[str, str] = {}
        for c, parent in self.parents.items():
            path = os.path.join(parent, name)
            if path not in dirs.values():
                self._mkdir(cg, path)
                cg.agent_dirs.append(path)
            dirs[c] = path
        if "memory" in dirs:
            cmd = self._mkdir(cg, os.path.join(dirs["memory"], COMMAND_CHILD))
            cg.command_dirs.append(cmd)
            cg.events = os.path.join(cmd, "memory.oom_control")
            if memory is not None and self._set(cmd, "memory.limit_in_bytes", str(memory)):
                cg.enforced["memory"] = "cgroup-v1"
                if os.path.exists(os.path.join(cmd, "memory.memsw.limit_in_bytes")):
                    self._set(cmd, "memory.memsw.limit_in_bytes", str(memory))
        if pids is not None and "pids" in dirs and self._set(dirs["pids"], "pids.max", str(pids)):
            cg.enforced["pids"] = "cgroup-v1"
        if "cpuacct" in dirs:
            cg.cpu_usage = os.path.join(dirs["cpuacct"], "cpuacct.usage")
        if "cpu" in dirs:
            cg.enforced["cpu_share"] = "cgroup-v1"
            top = dirs["cpu"]
            weight = DEFAULT_CPU_WEIGHT if self.cpu_weight is None else self.cpu_weight
            if self.cpu_weight is not None:
                self._set(top, "cpu.shares", _shares(weight))
            cg.weight_file = os.path.join(top, "cpu.shares")
            cg.enforced["cpu_priority"] = "cgroup-v1"
            cg.weight_usual, cg.weight_priority = _shares(weight), _shares(PRIORITY_CPU_WEIGHT)
            # The agent and the commands as siblings (see the module docstring); where the cpu
            # hierarchy is shared with memory, ``S/cmd`` is the memory child already made above.
            agent = self._mkdir(cg, os.path.join(top, AGENT_CHILD))
            cg.ns_root_dirs = list(cg.agent_dirs)  # every top group ``S``: the cgroup namespace's roots
            cg.agent_dirs[cg.agent_dirs.index(top)] = agent
            self._set(agent, "cpu.shares", _shares(AGENT_CPU_WEIGHT))
            cmd = os.path.join(top, COMMAND_CHILD)
            if cmd not in cg.command_dirs:
                cg.command_dirs.append(self._mkdir(cg, cmd))
            if cpu is not None:
                quota = max(1000, int(cpu * CPU_PERIOD_US))
                if self._set(cmd, "cpu.cfs_period_us", str(CPU_PERIOD_US)) and self._set(
                    cmd, "cpu.cfs_quota_us", str(quota)
                ):
                    cg.enforced["cpu"] = "cgroup-v1"

    def _create_v2(self, cg: SandboxCgroup, name: str, pids: int | None, memory: int | None, cpu: float | None) -> None:
        top = self._mkdir(cg, os.path.join(next(iter(self.parents.values())), name))
        split = sorted({"memory", "cpu"} & self.available)
        cmd = top
        if split:
            _write(os.path.join(top, "cgroup.subtree_control"), " ".join("+" + c for c in split))
            agent = self._mkdir(cg, os.path.join(top, AGENT_CHILD))
            cg.agent_dirs.append(agent)
            cmd = self._mkdir(cg, os.path.join(top, COMMAND_CHILD))
            cg.command_dirs.append(cmd)
            if "cpu" in split:
                self._set(agent, "cpu.weight", str(AGENT_CPU_WEIGHT))
        else:
            cg.agent_dirs.append(top)
        if "memory" in self.parents:
            cg.events = os.path.join(cmd, "memory.events")
            if memory is not None and self._set(cmd, "memory.max", str(memory)):
                cg.enforced["memory"] = "cgroup-v2"
                if os.path.exists(os.path.join(cmd, "memory.swap.max")):
                    self._set(cmd, "memory.swap.max", "0")
        if pids is not None and "pids" in self.parents and self._set(top, "pids.max", str(pids)):
            cg.enforced["pids"] = "cgroup-v2"
        cg.cpu_usage = os.path.join(top, "cpu.stat")
        if "cpu" in self.parents:
            cg.enforced["cpu_share"] = "cgroup-v2"
            if self.cpu_weight is not None:
                self._set(top, "cpu.weight", str(self.cpu_weight))
            cg.weight_file = os.path.join(top, "cpu.weight")
            cg.enforced["cpu_priority"] = "cgroup-v2"
            cg.weight_usual = str(DEFAULT_CPU_WEIGHT if self.cpu_weight is None else self.cpu_weight)
            cg.weight_priority = str(PRIORITY_CPU_WEIGHT)
            if cpu is not None and self._set(cmd, "cpu.max", f"{max(1000, int(cpu * CPU_PERIOD_US))} {CPU_PERIOD_US}"):
                cg.enforced["cpu"] = "cgroup-v2"

    @staticmethod
    def _set(path: str, name: str, value: str) -> bool:
        try:
            _write(os.path.join(path, name), value)
        except OSError as exc:
            log.info("cgroup limit not set", path=path, file=name, error=str(exc))
            return False
        return True
