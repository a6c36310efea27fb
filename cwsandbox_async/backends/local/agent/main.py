"""Entry points of the agent package inside a sandbox (stdlib only).

- ``boot(config, bundle)``: called by the driver's ``BOOTSTRAP`` once it loaded this
  package from ``bundle``. Depending on the configuration it becomes the agent
  (``run``) or a fresh template (``role: template``, when the agent replaces a killed
  one).
- ``run(config, rfd, wfd, cgroup=...)``: the agent itself, on the given channel fds
  (they may be one socket). A zygote calls it in each newborn, after namespaces,
  mounts and the uid drop. ``cgroup`` holds fds the driver opened: ``cmd_procs``
  (``cgroup.procs`` of the commands' cgroup(s); the template writes itself into
  them, so every worker and command is born there while the agent stays outside
  their memory limit) and ``cmd_events`` (the file counting that cgroup's OOM kills).

Order at the start of ``run``, before any request is read: the unprivileged
hardening (a fresh session keyring, then the seccomp filter, last), then the
agent's own setup (preloaded modules, the template fork), then ``HELLO``. What
the hardening did is reported in the hello (``hardening``).
"""

from __future__ import annotations

import json
import os
import sys

from . import harden, settings, template

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


#: How a fresh interpreter loads this package from the directory it was imported from.
DISK_BOOTSTRAP = "import sys;sys.path.insert(0,{root!r});from {package} import main;main.boot_fd(int(sys.argv[3]))"


def boot_info(bundle: bytes | None) -> dict[str, Any]:
    """How to start a fresh interpreter of this package later (a new template): bootstrap code, payload."""
    info: dict[str, Any] = {}
    argv = getattr(sys, "orig_argv", [])
    package = __name__.rpartition(".")[0]
    if bundle is not None and "-c" in argv:
        info["bootstrap"] = argv[argv.index("-c") + 1]  # the driver's BOOTSTRAP: the bundle comes along
    elif bundle is None and getattr(sys.modules[package], "__file__", None):
        root = os.path.dirname(os.path.dirname(os.path.abspath(str(sys.modules[package].__file__))))
        info["bootstrap"] = DISK_BOOTSTRAP.format(root=root, package=package)
    else:
        return info
    carried = bundle or b""

    def payload(config: dict[str, Any]) -> bytes:
        encoded = json.dumps(config, separators=(",", ":")).encode()
        return len(carried).to_bytes(4, "big") + len(encoded).to_bytes(4, "big") + carried + encoded

    info["payload"] = payload
    return info


def run(
    config: dict[str, Any],
    rfd: int = 0,
    wfd: int = 1,
    boot: dict[str, Any] | None = None,
    cgroup: dict[str, Any] | None = None,
) -> NoReturn:
    """Serve the protocol on ``rfd``/``wfd`` until the driver goes away; never returns."""
    from . import server

    info = boot_info(None) if boot is None else dict(boot)
    info["hardening"] = harden.apply_unprivileged(seccomp=bool(config.get("seccomp", True)))
    info["cpus"] = cpus_for(config)
    info["cgroup"] = dict(cgroup or {})
    opts = settings.Settings(config.get("settings"))
    preload(config)
    # The template first, before this process builds anything of its own: every page dirtied from
    # here on is the agent's alone, not shared with (and paid for by) the template's copy.
    info["template"] = fork_template(config, opts, info["cpus"], info["cgroup"].get("cmd_procs") or [])
    try:
        agent = server.Agent(config, opts, rfd, wfd, info)
        agent.serve()
    except BrokenPipeError:
        os._exit(0)
    except BaseException:
        import traceback

        traceback.print_exc()
    os._exit(70)


def fork_template(config: dict[str, Any], opts: settings.Settings, cpus: float, joins: list[int]) -> Any:
    """Fork the template now (see ``template``); ``(pid, socket)`` for the agent, or None on failure."""
    import socket

    from .sysapi import PR_SET_DUMPABLE, prctl
    from .worker import Worker, max_fd

    prctl(PR_SET_DUMPABLE, 0)  # inherited: neither the template nor its workers can be traced or read
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.fork()
    except OSError:
        mine.close()
        theirs.close()
        return None
    if pid == 0:
        mine.close()
        limit = max_fd()

        def birth(sock: socket.socket) -> NoReturn:
            Worker(sock, config, opts, cpus).serve(limit)

        template.serve(theirs, birth, joins=[os.dup(int(fd)) for fd in joins])
    theirs.close()
    return pid, mine


def run_template(config: dict[str, Any]) -> NoReturn:
    """A fresh template interpreter: preload, join the commands' cgroup, birth workers on ``FRESH_FD``."""
    import socket

    from .worker import Worker, max_fd

    preload(config)
    opts = settings.Settings(config.get("settings"))
    cpus = cpus_for(config)
    limit = max_fd()
    joins = [template.FRESH_FD + 2 + i for i in range(int(config.get("joins") or 0))]

    def birth(sock: socket.socket) -> NoReturn:
        Worker(sock, config, opts, cpus).serve(limit)

    template.serve(socket.socket(fileno=template.FRESH_FD), birth, joins=joins)


def preload(config: dict[str, Any]) -> None:
    """Import ``config["preload"]`` (a module missing from this image is skipped)."""
    for name in config.get("preload") or ():
        try:
            __import__(name)
        except Exception:  # a module missing (or broken) in this image is simply not preloaded
            continue


def boot_fd(fd: int) -> NoReturn:
    """``boot`` from a payload in ``fd`` (``u32 bundle length, u32 config length, bundle, config``)."""
    data = b""
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    n, c = int.from_bytes(data[:4], "big"), int.from_bytes(data[4:8], "big")
    boot(data[8 + n : 8 + n + c], data[8 : 8 + n] or None)


def open_cgroup_paths(paths: dict[str, Any]) -> dict[str, Any]:
    """``config["cgroup_paths"]`` (an agent on the host, ``isolation="none"``): join the agent's
    groups now, open the commands' ``cgroup.procs`` and OOM counter. ``OSError`` if refused."""
    for path in paths.get("agent_procs") or ():
        with open(path, "w") as f:
            f.write("0")
    out: dict[str, Any] = {"cmd_procs": [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in paths.get("cmd_procs") or ()]}
    events = paths.get("cmd_events")
    out["cmd_events"] = os.open(events, os.O_RDONLY | os.O_CLOEXEC) if events else None
    return out


def boot(config_bytes: bytes, bundle: bytes | None = None) -> NoReturn:
    """Called by ``BOOTSTRAP``: become what the configuration says (module docstring)."""
    try:
        config = json.loads(config_bytes) if config_bytes else {}
        if config.get("role") == "template":
            run_template(config)
        cgroup = open_cgroup_paths(config["cgroup_paths"]) if config.get("cgroup_paths") else None
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(71)
    run(config, boot=boot_info(bundle), cgroup=cgroup)
