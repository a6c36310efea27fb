"""Exec and files in a pod, with the verdict facts a real cluster hides: who killed the command, and why.

Each command runs in a session of its own (``_inpod``). How an exec ends, and what follows:

- **status received**: the exit code. 124/137 at or past the timeout is ``timed_out`` (the
  session is then killed, so nothing it left behind lingers); 152 under a CPU budget is
  ``cpu_exceeded``; 137 *before* the timeout is ambiguous: the program may have been
  SIGKILLed inside a live container, or the container died. The backend asks the cluster
  (the watch's view, else a probe exec): a live container means the program's own 137.
- **the pod died mid-exec** (the shared watch says so while the stream is open): the
  stream gets ``death_grace_seconds`` to deliver its status, then is given up (a dying
  container's stream may hang, kubernetes#129144).
- **no status** (the stream closed, or the client deadline passed): the container is
  checked the same way; alive means a broken transport (``SandboxTransportError``) or,
  past the deadline, the program's timeout (its session is killed).
- **a dead container** is reported by why it died (``death_settle_seconds`` to learn it):
  ``OOMKilled`` is the program's OOM, a result (``ExecExit.oom_killed``, returncode -9);
  anything else raises ``SandboxNotRunningError`` whose ``infrastructure`` says whose fault
  it was (``PodView.infrastructure``).
- **abandoned** (output cap, deadline, cancellation, broken stream): the socket and the
  session id go to ``Cleanup``, which kills the session in the background; the next call
  on that sandbox waits for it first.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import anyio

from ..._errors import (
    SandboxBackendUnavailableError,
    SandboxError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxTransportError,
)
from ..._types import ExecExit, ExecRequest
from ..base import OutputCallback
from ._cleanup import Cleanup
from ._client import KubeApiError, KubeClient
from ._exec import Abandoned, ExecStatusError, StreamResult, close_socket, exit_code, read_header, stream_exec
from ._files import read_argv, read_result, write_argv, write_result
from ._inpod import exec_argv, kill_argv, kill_token_argv
from ._options import KubernetesOptions
from ._podstate import MAIN_CONTAINER, PodView

__all__ = ["PodRunner", "Pods"]

#: What the container runtime says (inside an ``InternalError`` Status) when the container is gone.
#: containerd says ``container is in CONTAINER_EXITED state``; others name the container (``container "main" is
#: not running``), so the phrases are matched without it.
_GONE = (
    "is not running",
    "container not found",
    "no such container",
    "cannot exec in a stopped",
    "container_exited",
    "exited state",
)
_SIGKILL, _SIGTERM, _SIGXCPU = 9, 15, 24


class Pods(Protocol):
    """What the runner asks the backend about its pods."""

    def destroyed(self, sandbox_id: str) -> bool: ...
    def cached(self, sandbox_id: str) -> PodView | None: ...
    async def fetch(self, sandbox_id: str) -> PodView: ...
    def dead_waiter(self, sandbox_id: str) -> Callable[[], Awaitable[PodView]] | None: ...
    def cpu_seconds(self, sandbox_id: str) -> int | None: ...


def _gone(status: dict[str, Any]) -> bool:
    message = str(status.get("message") or "").lower()
    return any(g in message for g in _GONE)


class PodRunner:
    """Runs commands in pods for one backend (see the module docstring)."""

    def __init__(
        self,
        options: KubernetesOptions,
        connect: Callable[[], Awaitable[tuple[KubeClient, str]]],
        pods: Pods,
        cleanup: Cleanup,
    ) -> None:
        self.o = options
        self._connect = connect
        self._pods = pods
        self.cleanup = cleanup

    # -- streams ---------------------------------------------------------------
    def _check_usable(self, sandbox_id: str) -> None:
        if self._pods.destroyed(sandbox_id):
            raise SandboxTerminatedError(
                f"sandbox {sandbox_id} was destroyed", sandbox_id=sandbox_id, infrastructure=False
            )
        cached = self._pods.cached(sandbox_id)
        if cached is not None and cached.dead:
            raise cached.not_running_error()

    def _on_abandon(self, sandbox_id: str) -> Callable[[Abandoned], None]:
        def handle(ab: Abandoned) -> None:
            self.cleanup.spawn(sandbox_id, f"abandoned exec ({ab.why})", lambda: self._finish(sandbox_id, ab),
                               within=self.o.kill_timeout_seconds)  # fmt: skip

        return handle

    async def _finish(self, sandbox_id: str, ab: Abandoned) -> None:
        """Close an abandoned stream and kill its command's session (a dead pod has nothing to kill)."""
        if ab.why != "aborted" and ab.session is None:
            await read_header(ab.ws, ab.header)
        await close_socket(ab.ws)
        if ab.why == "aborted":
            return
        if ab.session is not None:
            await self.kill(sandbox_id, ab.session)
        elif ab.token is not None:  # the stream broke before its session id arrived
            await self.kill(sandbox_id, token=ab.token)

    async def stream(self, sandbox_id: str, argv: Sequence[str], **kw: Any) -> StreamResult:
        """One exec stream; a refused upgrade becomes the most specific error (a dead pod beats HTTP 400)."""
        client, ns = await self._connect()
        self._check_usable(sandbox_id)
        waiter = self._pods.dead_waiter(sandbox_id)

        async def abort() -> None:
            assert waiter is not None
            await waiter()
            await anyio.sleep(self.o.death_grace_seconds)

        try:
            return await stream_exec(
                client,
                ns,
                sandbox_id,
                argv,
                container=MAIN_CONTAINER,
                connect_timeout=2 * self.o.request_timeout_seconds,
                drain_seconds=self.o.drain_seconds,
                on_abandon=self._on_abandon(sandbox_id),
                abort=abort if waiter is not None else None,
                **kw,
            )
        except KubeApiError as exc:
            raise await self._diagnose(sandbox_id, exc) from exc

    async def _diagnose(self, sandbox_id: str, exc: KubeApiError) -> SandboxError:
        if exc.status == 403:
            return SandboxBackendUnavailableError(  # the caller's RBAC rules
                f"exec into {sandbox_id} forbidden: grant get and create on pods/exec ({exc.message})",
                sandbox_id=sandbox_id,
                infrastructure=False,
            )
        try:
            with anyio.fail_after(self.o.request_timeout_seconds):
                pod = await self._pods.fetch(sandbox_id)
        except (SandboxError, TimeoutError):
            return exc
        if pod.dead:
            return pod.not_running_error()
        exc.sandbox_id = sandbox_id
        return exc

    async def kill(self, sandbox_id: str, session: int | None = None, *, token: str | None = None) -> None:
        """Kill a command's session inside the pod, by its id or by its wrapper's token (nothing to do when
        the pod or container is gone)."""
        argv = kill_argv(session) if session is not None else kill_token_argv(token or "")
        try:
            await self.stream(sandbox_id, argv, stdin=None, deadline_seconds=self.o.kill_timeout_seconds)
        except SandboxNotRunningError:
            return
        except KubeApiError as exc:
            if exc.status not in (400, 404):
                raise

    async def _container_dead(self, sandbox_id: str) -> bool:
        """Whether the pod's container has stopped: the watch's view, else a probe exec asks the runtime."""
        cached = self._pods.cached(sandbox_id)
        if cached is not None and cached.dead:
            return True
        waiter = self._pods.dead_waiter(sandbox_id)
        if waiter is not None:  # a dying container's exec ends (137) just before the pod's status says so
            with anyio.move_on_after(self.o.death_grace_seconds):
                await waiter()
                return True
        try:
            res = await self.stream(
                sandbox_id, ["/bin/sh", "-c", "exit 0"], stdin=None, deadline_seconds=self.o.request_timeout_seconds
            )
        except SandboxNotRunningError:
            return True
        except SandboxTransportError as exc:
            return bool(isinstance(exc, KubeApiError) and exc.status in (400, 404))
        return res.status is not None and res.status.get("status") != "Success" and _gone(res.status)

    async def _died(self, sandbox_id: str, res: StreamResult) -> ExecExit:
        """The container died during the exec: the program's OOM (a result), else ``SandboxNotRunningError``."""
        if self._pods.destroyed(sandbox_id):
            raise SandboxTerminatedError(
                f"sandbox {sandbox_id} was destroyed during the exec", sandbox_id=sandbox_id, infrastructure=False
            )
        pod: PodView | None = None
        waiter = self._pods.dead_waiter(sandbox_id)
        with anyio.move_on_after(self.o.death_settle_seconds):
            pod = await waiter() if waiter is not None else None
        if pod is None or not pod.dead:
            with anyio.move_on_after(self.o.request_timeout_seconds):
                pod = await self._pods.fetch(sandbox_id)
        if pod is not None and pod.oom_killed:
            return ExecExit(-_SIGKILL, res.stdout, res.stderr, res.wall_seconds, oom_killed=True)
        if pod is not None and pod.dead:
            raise pod.not_running_error()
        raise SandboxNotRunningError(
            f"the container of pod {sandbox_id} stopped during the exec (the pod did not say why)",
            sandbox_id=sandbox_id,
        )

    # -- exec ------------------------------------------------------------------
    def _cpu_budget(self, sandbox_id: str, request: ExecRequest) -> int | None:
        budgets = [b for b in (self._pods.cpu_seconds(sandbox_id), request.cpu_seconds) if b is not None]
        return max(1, math.ceil(min(budgets))) if budgets else None

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None) -> ExecExit:
        await self.cleanup.settle(sandbox_id)
        stdin = request.stdin or b""
        cpu = self._cpu_budget(sandbox_id, request)
        argv = exec_argv(
            request.argv,
            cwd=request.cwd,
            env=request.env,
            timeout=request.timeout_seconds,
            kill_grace=self.o.kill_grace_seconds,
            cpu_seconds=cpu,
            stdin_len=len(stdin),
            exclusive=request.exclusive,
        )

        async def on_chunk(channel: int, data: bytes) -> None:
            assert on_output is not None
            await on_output("stdout" if channel == 1 else "stderr", data)

        res = await self.stream(
            sandbox_id,
            argv,
            stdin=stdin,
            deadline_seconds=request.timeout_seconds + self.o.kill_grace_seconds + self.o.exec_slack_seconds,
            gate=True,
            max_stdout=request.max_output_bytes,
            max_stderr=request.max_output_bytes,
            on_chunk=on_chunk if on_output is not None else None,
        )
        return await self._outcome(sandbox_id, request, res, cpu)

    async def _outcome(self, sandbox_id: str, request: ExecRequest, res: StreamResult, cpu: int | None) -> ExecExit:
        def result(rc: int, **kw: Any) -> ExecExit:
            return ExecExit(rc, res.stdout, res.stderr, res.wall_seconds, **kw)

        if res.aborted:
            return await self._died(sandbox_id, res)
        if res.truncated:
            return result(-_SIGKILL, truncated=True)
        if res.status is None:
            if await self._container_dead(sandbox_id):
                return await self._died(sandbox_id, res)
            if res.deadline_hit:
                return result(-_SIGKILL, timed_out=True)
            raise SandboxTransportError(
                f"exec stream to {sandbox_id} closed without an exit status ({res.protocol})", sandbox_id=sandbox_id
            )
        try:
            rc = exit_code(res.status, sandbox_id)
        except ExecStatusError:
            if _gone(res.status) or await self._container_dead(sandbox_id):
                return await self._died(sandbox_id, res)
            raise
        timed_out = rc in (124, 128 + _SIGKILL) and res.wall_seconds >= request.timeout_seconds
        if timed_out:
            cached = self._pods.cached(sandbox_id)
            if cached is not None and cached.dead:
                return await self._died(sandbox_id, res)
            if res.session is not None:  # what the timeout did not reach (other process groups) goes too
                session = res.session
                self.cleanup.spawn(sandbox_id, "timed-out exec", lambda: self.kill(sandbox_id, session),
                                   within=self.o.kill_timeout_seconds)  # fmt: skip
            return result(-_SIGTERM if rc == 124 else -_SIGKILL, timed_out=True)
        if rc == 128 + _SIGKILL and await self._container_dead(sandbox_id):
            return await self._died(sandbox_id, res)
        if cpu is not None and rc == 128 + _SIGXCPU:
            return result(-_SIGXCPU, cpu_exceeded=True)
        return result(rc)

    # -- files -----------------------------------------------------------------
    async def _checked(self, sandbox_id: str, res: StreamResult, what: str) -> int:
        """The exit code of a file stream; a dead pod or missing status raises."""
        if res.aborted:
            await self._died(sandbox_id, res)
            raise SandboxNotRunningError(f"pod {sandbox_id} died during {what}", sandbox_id=sandbox_id)
        if res.deadline_hit or res.status is None:
            if await self._container_dead(sandbox_id):
                await self._died(sandbox_id, res)
            raise SandboxTransportError(f"{what} in {sandbox_id} did not finish cleanly", sandbox_id=sandbox_id)
        try:
            return exit_code(res.status, sandbox_id)
        except ExecStatusError:
            if _gone(res.status):
                await self._died(sandbox_id, res)
            raise

    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        await self.cleanup.settle(sandbox_id)
        res = await self.stream(
            sandbox_id,
            read_argv(path, max_bytes),
            stdin=None,
            gate=True,
            deadline_seconds=self.o.file_timeout_seconds,
            max_stdout=max_bytes + 1,
            max_stderr=64 * 1024,
        )
        rc = 0 if res.truncated else await self._checked(sandbox_id, res, f"read of {path}")
        return read_result(sandbox_id, path, max_bytes, rc, res.stdout, res.stderr, res.truncated)

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        await self.cleanup.settle(sandbox_id)
        res = await self.stream(
            sandbox_id,
            write_argv(path, len(data)),
            stdin=data,
            gate=True,
            deadline_seconds=self.o.file_timeout_seconds,
            max_stdout=1024,
            max_stderr=64 * 1024,
        )
        if res.truncated:
            raise SandboxTransportError(f"write of {path} did not finish cleanly", sandbox_id=sandbox_id)
        rc = await self._checked(sandbox_id, res, f"write of {path}")
        write_result(sandbox_id, path, len(data), rc, res.stdout, res.stderr)
