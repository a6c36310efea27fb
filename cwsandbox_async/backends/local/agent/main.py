"""Entry points of the agent package inside a sandbox (stdlib only).

- ``run(config, fd, cgroup=...)``: PID 1 of a template-born sandbox, on its channel socket ``fd``
  (``_birth`` calls it in each newborn, after namespaces, mounts and the uid drop). ``cgroup``
  holds fds the driver opened: ``cmd_procs`` (``cgroup.procs`` of the commands' cgroup(s): every
  child of an exec writes itself in, so the memory limit binds the commands and never PID 1),
  ``cmd_events`` (the file counting that cgroup's OOM kills) and ``sandbox_cpu`` (its CPU usage).
- ``boot(config, bundle)``: an unisolated agent (``isolation="none"``), called by the driver's
  ``BOOTSTRAP`` once it loaded this package: preloads, joins its cgroups from paths, then ``run``.

Order at the start of ``run``, before any order is read: the unprivileged hardening (a fresh
session keyring, then the seccomp filter, last), then ``HELLO``, which reports what the hardening
did (``hardening``). A sandbox whose filter is not installed does not use the native spawner
(``execs.Execs.spawn``): nothing would keep a command from stopping its vfork child.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from . import harden

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn


def cpus_for(config: dict[str, Any]) -> float:
    """CPUs the sandbox may use: this process's affinity, bounded by ``config["cpus"]`` (a quota)."""
    try:
        n = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        n = float(os.cpu_count() or 1)
    quota = config.get("cpus")
    return min(n, float(quota)) if quota else n


def run(config: dict[str, Any], fd: int, cgroup: dict[str, Any] | None = None) -> NoReturn:
    """Serve the driver on the channel ``fd`` until it goes away; never returns."""
    from . import init, settings

    hardening = harden.apply_unprivileged(seccomp=bool(config.get("seccomp", True)))
    info = {"hardening": hardening, "cpus": cpus_for(config), "cgroup": dict(cgroup or {})}
    config["spawner"] = usable_spawner(config, hardening)
    stamps = config.get("stamps")
    if isinstance(stamps, dict):
        stamps["hardened"] = time.monotonic()
    try:
        init.Init(config, settings.Settings(config.get("settings")), fd, info).serve()
    except BaseException:
        import traceback

        traceback.print_exc()
    os._exit(70)


def usable_spawner(config: dict[str, Any], hardening: dict[str, str]) -> str | None:
    """``config["spawner"]`` when the seccomp filter is installed, else None (every exec forks PID 1).

    The spawner starts as a vfork child of PID 1, and PID 1 waits in the kernel until it ``execve``s:
    only the filter (``seccomp`` item 6) keeps a command from stopping that child, and PID 1 with it."""
    spawner = config.get("spawner")
    return str(spawner) if spawner and hardening.get("seccomp") == "installed" else None


def preload(config: dict[str, Any]) -> None:
    """Import ``config["preload"]`` (a module missing from this image is skipped)."""
    for name in config.get("preload") or ():
        try:
            __import__(name)
        except Exception:  # a module missing (or broken) in this image is simply not preloaded
            continue


def open_cgroup_paths(paths: dict[str, Any]) -> dict[str, Any]:
    """``config["cgroup_paths"]`` (an agent on the host): join the agent's groups now, open the
    commands' ``cgroup.procs`` and OOM counter. ``OSError`` if refused."""
    for path in paths.get("agent_procs") or ():
        with open(path, "w") as f:
            f.write("0")
    out: dict[str, Any] = {"cmd_procs": [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in paths.get("cmd_procs") or ()]}
    events = paths.get("cmd_events")
    out["cmd_events"] = os.open(events, os.O_RDONLY | os.O_CLOEXEC) if events else None
    return out


def boot(config_bytes: bytes, bundle: bytes | None = None) -> NoReturn:
    """Called by ``BOOTSTRAP`` (an unisolated agent): preload, join the cgroups, ``run`` on ``channel_fd``."""
    try:
        # Nothing this agent was started with reaches a command: its channel (dup2'd to its place, so
        # inheritable) and whatever inheritable descriptors the driver's process had.
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2:
                with contextlib.suppress(OSError):  # the directory's own descriptor, closed by now
                    os.set_inheritable(int(name), False)
        config = json.loads(config_bytes) if config_bytes else {}
        preload(config)
        cgroup = open_cgroup_paths(config["cgroup_paths"]) if config.get("cgroup_paths") else None
        fd = int(config["channel_fd"])
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(71)
    run(config, fd, cgroup=cgroup)
