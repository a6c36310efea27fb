"""Entry points of the agent package inside a sandbox (stdlib only).

- ``boot(config, bundle)``: called by the driver's ``BOOTSTRAP`` once it loaded this
  package from ``bundle``. Depending on the configuration it becomes the agent
  (``run``), a fresh template (``role: template``, when the agent replaces a killed
  one), or, for the ``unshare`` fallback, first builds the sandbox's file system
  and re-executes itself as the sandbox user (``nsroot``).
- ``run(config, rfd, wfd, boot)``: the agent itself, on the given channel fds. A
  zygote calls it in each newborn, after namespaces, mounts and the uid drop.

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


def boot_info(bundle: bytes | None) -> dict[str, Any]:
    """What the agent needs to start a fresh template later: how it was itself started."""
    info: dict[str, Any] = {}
    argv = getattr(sys, "orig_argv", [])
    if bundle is not None and "-c" in argv:
        info["bootstrap"] = argv[argv.index("-c") + 1]

        def payload(config: dict[str, Any]) -> bytes:
            encoded = json.dumps(config, separators=(",", ":")).encode()
            return len(bundle).to_bytes(4, "big") + len(encoded).to_bytes(4, "big") + bundle + encoded

        info["payload"] = payload
    return info


def run(config: dict[str, Any], rfd: int = 0, wfd: int = 1, boot: dict[str, Any] | None = None) -> NoReturn:
    """Serve the protocol on ``rfd``/``wfd`` until the driver goes away; never returns."""
    from . import server

    info = dict(boot or {})
    info["hardening"] = harden.apply_unprivileged(seccomp=bool(config.get("seccomp", True)))
    info["cpus"] = cpus_for(config)
    try:
        agent = server.Agent(config, settings.Settings(config.get("settings")), rfd, wfd, info)
        agent.serve()
    except BrokenPipeError:
        os._exit(0)
    except BaseException:
        import traceback

        traceback.print_exc()
    os._exit(70)


def run_template(config: dict[str, Any]) -> NoReturn:
    """A fresh template interpreter: preload, then birth workers on ``template.FRESH_FD``."""
    import socket

    from .worker import Worker

    for name in config.get("preload") or ():
        try:
            __import__(name)
        except Exception:  # a module missing from this image is simply not preloaded
            continue
    opts = settings.Settings(config.get("settings"))
    cpus = cpus_for(config)
    from .scheduler import _max_fd

    max_fd = _max_fd()

    def birth(sock: socket.socket) -> NoReturn:
        Worker(sock, config, opts, cpus).serve(max_fd)

    template.serve(socket.socket(fileno=template.FRESH_FD), birth)


def boot(config_bytes: bytes, bundle: bytes | None = None) -> NoReturn:
    """Called by ``BOOTSTRAP``: become what the configuration says (module docstring)."""
    try:
        config = json.loads(config_bytes) if config_bytes else {}
        if config.get("role") == "template":
            run_template(config)
        if config.get("mounts") is not None:
            from . import nsroot

            nsroot.enter_unshared_root(config, bundle)
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(71)
    run(config, boot=boot_info(bundle))
