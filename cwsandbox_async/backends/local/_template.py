"""The driver's side of the template that births local sandboxes (see ``agent/_rootfs``, ``agent/_birth``).

``Template.start`` runs ``python3 -I -S agent/_rootfs.py cwsandbox-template <fd>`` once per backend:
the template builds the sandboxes' read-only root view and preloads the agent, then waits on its
control socket (``AF_UNIX``, ``SOCK_SEQPACKET``). ``Template.fork`` asks it for one sandbox: it
sends ``F`` with the newborn's channel socket and stderr pipe as SCM_RIGHTS; ``Template.deliver``
then writes the birth configuration (and the cgroup fds) to the channel itself, so the template
never sees it, and waits for the newborn's ``B`` record carrying a pidfd of its first process.
The two are separate so the driver prepares the sandbox's cgroups while the template forks.

Why this design (measured on a 2-core VM shared with other jobs, load average 8-19, Python 3.11; every
figure against a baseline in the same run; current figures in ``benchmarks/RESULTS.md``):

=============================================================  ==========================================
sandbox per create, the previous design                        ``bwrap`` + a fresh ``python3`` agent
                                                               each time: ~9x the fork+unshare floor
born from this template (cgroups, registry, namespaces,       4.5-7.8x the floor (p50); CPU 15 ms per
mounts, hardening, the agent's hello)                          create+stop vs 1.3 ms for the floor
a fresh sandbox per HumanEval program, 4 at a time             0.98x nsjail per run (was 2.3x)
idle memory per sandbox, 1,000 live                            1.50x a bare ``python3 -I -S`` (was 2.45x)
=============================================================  ==========================================

A bwrap per sandbox pays a process exec and an interpreter start for every sandbox and keeps one
more process (bwrap) alive per sandbox; the template pays them once. The template has its own
user namespace so that, as root, it can map a range of unprivileged host uids and give every
sandbox its own (bwrap maps a single uid). Nothing in the template's memory ever came from a
request: it reads nothing but ``F``. Considered and not done yet: the template ``clone()``-ing the
sandbox's PID 1 directly with ``CLONE_NEWPID`` (one fork less per birth); the namespaces would then
be owned by the template's user namespace, and forbidding nested user namespaces for a driver that is
not root would need another mechanism than ``user.max_user_namespaces`` (read-only ``/proc/sys`` by then).

The template answers its configuration with ``R`` once it serves, or ``R!`` and a reason when the
native spawner (``_native``) it was given does not run in the root view; then every sandbox's
commands fork PID 1 and the driver says so once at WARNING.

Failures: ``start`` raises ``SandboxBackendUnavailableError`` with the template's error output;
``fork``/``deliver`` raise ``SandboxCreationError`` with the newborn's error output (or ``OSError`` for the
driver's own socket calls). Neither opens a deadline of its own: the caller's scope bounds them.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import weakref
from pathlib import Path
from typing import Any

import anyio

from ..._errors import SandboxBackendUnavailableError, SandboxCreationError
from ..._log import log
from . import _native
from ._link import ProcessHandles
from ._threads import Blocking

__all__ = ["AGENT_DIR", "MARKER", "Template", "pidfd_pid"]

#: The in-sandbox package, bound read-only into every sandbox.
AGENT_DIR = str(Path(__file__).resolve().parent / "agent")
ROOTFS_SCRIPT = os.path.join(AGENT_DIR, "_rootfs.py")
#: Marker on the template's command line (and so on every sandbox process's: they are its forks).
MARKER = "cwsandbox-template"
FORK = b"F"
BORN = b"B"
READY = b"R"


class Template:
    """One template process. ``config``: see ``agent/_rootfs.main`` (id map, plan, preload).

    The template is not an asyncio subprocess: it is watched through a pidfd and reaped when it is
    found dead, so a backend that is dropped without ``aclose`` leaves no transport behind (its
    control socket then closes on collection, and the template exits).
    """

    def __init__(self, python: str, config: dict[str, Any], blocking: Blocking) -> None:
        self.blocking = blocking
        self.python = python
        self.config = config
        self._ctl: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd = -1
        self._stderr = -1
        self._finalizer: weakref.finalize[Any, Template] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        if self._ctl is None or self._pidfd < 0:
            return False
        exited, _, _ = select.select([self._pidfd], [], [], 0)
        return not exited

    def _spawn(self, theirs: socket.socket) -> None:
        """Worker thread: fork and exec the template (a few ms; never on the event loop)."""
        argv = [self.python, "-I", "-S", ROOTFS_SCRIPT, MARKER, str(theirs.fileno())]
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err_w,
                pass_fds=(theirs.fileno(),),
                cwd="/",
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,
            )
        except BaseException:
            os.close(err_r)
            raise
        finally:
            os.close(err_w)
        self._stderr = err_r
        os.set_blocking(err_r, False)
        self._pidfd = os.pidfd_open(self._proc.pid)
        self._finalizer = weakref.finalize(self, _release, self._proc, self._pidfd, err_r)

    async def start(self) -> None:
        """Start the template and wait until it serves; ``SandboxBackendUnavailableError`` if it fails."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            await self.blocking(self._spawn, theirs)
        except OSError as exc:
            mine.close()
            raise SandboxBackendUnavailableError(f"cannot start the sandbox template ({self.python}): {exc}") from exc
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        mine.setblocking(False)
        self._ctl = mine
        weakref.finalize(self, mine.close)  # a backend dropped without aclose: its template exits with it
        try:
            mine.send(json.dumps(self.config, separators=(",", ":")).encode())
            await anyio.wait_readable(mine)
            reply = mine.recv(1024)
        except OSError as exc:
            reply = b""
            log.debug("template control socket failed", error=str(exc))
        except BaseException:
            self.kill()
            self.close()
            raise
        if reply[:1] != READY:
            self.close()
            await anyio.wait_readable(self._pidfd)  # it is exiting: its control socket closed
            raise SandboxBackendUnavailableError(f"the sandbox template failed to start: {self.error_output()}")
        if reply[1:2] == b"!":  # the native spawner did not run in the sandbox's root view
            _native.warn_once(reply[2:].decode("utf-8", "replace"))
        log.debug("sandbox template started", pid=self.pid, python=self.python)

    def error_output(self) -> str:
        """What the template wrote to stderr so far (its last 2000 characters)."""
        out = b""
        try:
            while self._stderr >= 0 and (chunk := os.read(self._stderr, 65536)):
                out += chunk
        except BlockingIOError:  # nothing more for now
            pass
        return out.decode("utf-8", "replace").strip()[-2000:]

    async def fork(self, newborn: ProcessHandles, first: bytes) -> None:
        """Ask the template for a newborn: ``F`` with its channel (a ``SOCK_SEQPACKET`` socket, see
        ``agent.protocol``) and stderr pipe (``newborn.sock``/``stderr``).

        ``first`` (the birth configuration) is queued on the newborn's channel at once, so it finds it
        there; it then waits for the second message (``deliver``), and exits if the channel closes first.
        """
        ctl = self._ctl
        if ctl is None or not self.alive:
            raise SandboxCreationError("the sandbox template is not running", reason="template")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        newborn.sock = mine
        mine.setblocking(False)
        err_r, err_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        newborn.stderr = err_r
        try:
            await _sendmsg(mine, first, [])
            await _sendmsg(ctl, FORK, [theirs.fileno(), err_w])
        finally:
            theirs.close()
            os.close(err_w)

    async def deliver(self, newborn: ProcessHandles, payload: bytes, fds: list[int]) -> None:
        """Send the newborn its configuration (and ``fds``), then wait for its ``B`` record.

        Returns once it arrived (``newborn.pidfd`` set; ``newborn.pid`` is filled in by the caller,
        off the loop: ``pidfd_pid``). The caller closes ``fds``, and ``newborn`` when anything fails.
        """
        mine = newborn.sock
        assert mine is not None
        try:
            await _sendmsg(mine, payload, fds)
        except (BrokenPipeError, ConnectionResetError):  # no newborn holds the channel: it was not forked
            raise SandboxCreationError(
                f"the sandbox was not born: {self._newborn_error(newborn)}", reason="birth"
            ) from None
        await anyio.wait_readable(mine)
        try:
            msg, ancillary, _, _ = mine.recvmsg(1, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
        except OSError as exc:
            msg, ancillary = b"", []
            log.debug("newborn channel failed", error=str(exc))
        got = [fd for level, kind, data in ancillary for fd in _unpack_fds(level, kind, data)]
        if msg != BORN or len(got) != 1:
            for fd in got:
                os.close(fd)
            raise SandboxCreationError(f"the sandbox was not born: {self._newborn_error(newborn)}", reason="birth")
        newborn.pidfd = got[0]

    def _newborn_error(self, newborn: ProcessHandles) -> str:
        out = b""
        try:
            while chunk := os.read(newborn.stderr, 65536):
                out += chunk
        except BlockingIOError:  # nothing more yet: report what there is
            pass
        text = out.decode("utf-8", "replace").strip()[-2000:]
        if text:
            return text
        if not self.alive:
            return f"the template exited: {self.error_output()}"
        return "the template could not fork (a process limit?)"

    def close(self) -> None:
        """Close the control socket: the template exits, and every sandbox it birthed with it."""
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None

    def kill(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def aclose(self) -> None:
        """Stop the template (and all its sandboxes) and wait for it to exit; bounded by the caller.

        If the caller's deadline cuts the wait short, the template is SIGKILLed (it then dies at once).
        """
        self.close()
        if self._pidfd < 0:
            return
        try:
            await anyio.wait_readable(self._pidfd)
        finally:
            self._pidfd = self._stderr = -1
            if self._finalizer is not None:
                self._finalizer()


def _release(proc: subprocess.Popen[bytes], pidfd: int, stderr: int) -> None:
    """Kill and reap the template and close its fds (``aclose``, or the collection of a dropped backend)."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    proc.wait()  # SIGKILLed: it is gone in moments
    os.close(pidfd)
    os.close(stderr)


def _unpack_fds(level: int, kind: int, data: bytes) -> list[int]:
    if level != socket.SOL_SOCKET or kind != socket.SCM_RIGHTS:
        return []
    return list(array.array("i", data[: len(data) - len(data) % 4]))


async def _sendmsg(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """Send one message (``data`` with ``fds``) on a non-blocking socket, waiting for room."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    while True:
        try:
            sock.sendmsg([data], ancillary)
            return
        except BlockingIOError:
            await anyio.wait_writable(sock)


def pidfd_pid(pidfd: int) -> int | None:
    """The pid (in this process's namespace) a pidfd refers to, from ``/proc/self/fdinfo``."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        return None
    return None
