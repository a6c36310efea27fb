"""Per-sandbox cgroups (v1 or v2): created by the backend, limited, and removed on destroy.

The backend only ever writes to groups it created itself, named
``cwsandbox_async-<sandbox id>``, placed under the cgroup this process is in (so the
parent's own limits keep applying), or under ``cgroup_parent`` when given. It never
changes a group it did not create: on v2 it uses a parent only if the controllers
it needs are already enabled in that parent's ``cgroup.subtree_control``.

- v1 (controllers mounted separately, e.g. ``/sys/fs/cgroup/pids``): one directory
  per controller (``pids``, ``memory``, ``cpu``).
- v2 (one unified hierarchy): one directory with ``pids.max``, ``memory.max``,
  ``memory.swap.max`` and ``cpu.max``.

Where no controller is writable, ``CgroupManager.available`` is empty and the
backend falls back to rlimits (see ``_backend``). All calls are synchronous and
cheap (a few small writes to a kernel file system).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field

from ..._log import log

__all__ = ["PREFIX", "CgroupManager", "SandboxCgroup", "is_our_cgroup", "process_tree"]

PREFIX = "cwsandbox_async-"
CONTROLLERS = ("pids", "memory", "cpu")
CPU_PERIOD_US = 100_000


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


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
    """True for a directory this backend could have created: under a cgroup mount, with our prefix."""
    real = os.path.realpath(path)
    if not os.path.basename(real).startswith(PREFIX):
        return False
    return any(real.startswith(mp.rstrip("/") + "/") for _, mp, _, _ in _mounts())


@dataclass
class SandboxCgroup:
    """The groups created for one sandbox (one per v1 controller, or one v2 group)."""

    paths: list[str]
    enforced: dict[str, str] = field(default_factory=dict)

    def attach(self, pid: int) -> None:
        """Move one process into every group; raises ``OSError`` if the kernel refuses."""
        for path in self.paths:
            _write(os.path.join(path, "cgroup.procs"), str(pid))

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
        """Remove the groups that are empty; True when none is left."""
        left = []
        for path in self.paths:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError:
                left.append(path)
        self.paths = left
        return not left

    def memory_events(self) -> dict[str, int]:
        """OOM kills seen by the memory controller (v1 ``memory.oom_control``, v2 ``memory.events``)."""
        for path in self.paths:
            for name in ("memory.events", "memory.oom_control"):
                try:
                    text = _read(os.path.join(path, name))
                except OSError:
                    continue
                out = {}
                for line in text.splitlines():
                    key, _, value = line.partition(" ")
                    if value.strip().isdigit():
                        out[key] = int(value)
                return out
        return {}


class CgroupManager:
    """Finds where this process may create cgroups, once; then creates one group set per sandbox."""

    def __init__(self, *, enabled: bool = True, parent: str | None = None) -> None:
        self.version: str | None = None
        #: controller -> directory under which sandbox groups are created
        self.parents: dict[str, str] = {}
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

    def create(
        self, sandbox_id: str, *, pids: int | None, memory_bytes: int | None, cpu: float | None
    ) -> SandboxCgroup | None:
        """Create and limit the groups for one sandbox; None when no controller is usable.

        A limit that cannot be written is logged and left out of ``enforced``; the
        caller then applies the rlimit fallback for it.
        """
        wanted = {"pids": pids, "memory": memory_bytes, "cpu": cpu}
        if not any(wanted[c] is not None for c in self.parents):
            return None
        name = PREFIX + sandbox_id
        dirs: dict[str, str] = {}
        for c, parent in self.parents.items():
            if wanted[c] is None:
                continue
            path = os.path.join(parent, name)
            if path not in dirs.values():
                try:
                    os.mkdir(path, 0o755)
                except FileExistsError:
                    pass
                except OSError as exc:
                    log.info("cgroup not created", path=path, error=str(exc))
                    continue
            dirs[c] = path
        if not dirs:
            return None
        cg = SandboxCgroup(paths=sorted(set(dirs.values())))
        tag = f"cgroup-{self.version}"
        if pids is not None and "pids" in dirs and self._set(dirs["pids"], "pids.max", str(pids)):
            cg.enforced["pids"] = tag
        if memory_bytes is not None and "memory" in dirs:
            path = dirs["memory"]
            if self.version == "v1":
                if self._set(path, "memory.limit_in_bytes", str(memory_bytes)):
                    cg.enforced["memory"] = tag
                    if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                        self._set(path, "memory.memsw.limit_in_bytes", str(memory_bytes))
            elif self._set(path, "memory.max", str(memory_bytes)):
                cg.enforced["memory"] = tag
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    self._set(path, "memory.swap.max", "0")
        if cpu is not None and "cpu" in dirs:
            quota = max(1000, int(cpu * CPU_PERIOD_US))
            path = dirs["cpu"]
            ok = (
                self._set(path, "cpu.cfs_period_us", str(CPU_PERIOD_US))
                and self._set(path, "cpu.cfs_quota_us", str(quota))
                if self.version == "v1"
                else self._set(path, "cpu.max", f"{quota} {CPU_PERIOD_US}")
            )
            if ok:
                cg.enforced["cpu"] = tag
        return cg

    @staticmethod
    def _set(path: str, name: str, value: str) -> bool:
        try:
            _write(os.path.join(path, name), value)
        except OSError as exc:
            log.info("cgroup limit not set", path=path, file=name, error=str(exc))
            return False
        return True
