"""The test server's exec RPCs: unary ``Exec`` and bidirectional ``StreamExec``, run in real local sandboxes.

``ExecHandlers`` is mixed into ``server.SandboxService`` (it uses the servicer's ``local``
backend, ``faults``, ``requests`` and box registry). Unary Exec drains a command's output
past ``max_output_bytes`` and only cuts the answer (as ``*_bytes_produced`` suggests);
StreamExec sends ``ready``, reads stdin until the client half-closes, runs the command,
streams its output as frames, then sends ``exit`` (faults may cut the stream, end it
with an in-band error, or kill the sandbox under the command).

On the wire a ``StreamExec`` is what the protocol says: HEADERS, ``ready``, any output, ``exit``,
then the OK status. Its timing is this machine's, not the service's (measured with an HTTP/2 frame
log, 8 execs of ``true`` in flight, load 10-20 on 2 cores): ``ready`` leaves before the command
starts (stdin is buffered until the client closes it, so ``ready`` must come first: a client with
stdin waits for it), ``exit`` follows 12-16 ms later (a real sandbox on a busy loop; at 192 in
flight each exec waits behind the others, 0.7-1 s), and the status leaves in a write of its own
after ``exit`` (grpc.aio sends a stream's status in a batch after its last message), usually after
the client has already ended the call at ``exit`` (RST_STREAM in 60-85% of streams). A client whose
CPU per exec grows with the time between frames costs more here than on a server that answers at
once (``benchmarks/_plain_server.py``); bench_coreweave reports both servers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from cwsandbox._proto import sandbox_pb2 as pb

from cwsandbox_async._errors import SandboxError, SandboxNotRunningError
from cwsandbox_async._types import ExecRequest
from cwsandbox_async.backends import Backend

from ._faults import Abort, Faults
from ._state import Record, now

if TYPE_CHECKING:
    from ._state import Box

C = grpc.StatusCode
#: Longest a command may run when the call has no deadline.
MAX_EXEC_SECONDS = 3600.0
#: How much output of one exec the server reads before it ends the command anyway.
DRAIN_CAP = 64 * 1024 * 1024


class ExecHandlers:
    """Exec and StreamExec of the servicer (a mixin: the servicer provides these attributes and helpers)."""

    local: Backend
    faults: Faults
    requests: list[Record]
    exec_responses: list[Any]
    active_execs: int
    _box: Callable[..., Box]
    _enter: Callable[..., Awaitable[None]]
    _serve: Callable[..., Awaitable[Any]]

    def _exec_request(self, box: Box, argv: Any, env: Any, stdin: bytes | None, cap: int, context: Any) -> ExecRequest:
        if not argv:
            raise Abort(C.INVALID_ARGUMENT, "command is required", "CWSANDBOX_INVALID_REQUEST")
        remaining = context.time_remaining()
        timeout = MAX_EXEC_SECONDS if remaining is None else max(0.05, min(remaining, MAX_EXEC_SECONDS))
        container = box.sandbox.spec.containers[0]
        cwd = next((m.mount_path for m in container.volume_mounts), None) or container.working_dir or "/workspace"
        return ExecRequest(tuple(argv), cwd, dict(env), stdin, timeout, cap or DRAIN_CAP)

    async def _died(self, box: Box) -> None:
        """Fault ``die_during_exec``: the sandbox's container ends (e.g. OOMKilled) under the command."""
        reason, self.faults.die_during_exec = self.faults.die_during_exec, None
        box.set_state(pb.STATE_FAILED, reason or "Error")
        with contextlib.suppress(SandboxError):
            await self.local.destroy(box.local_id)
        raise Abort(C.UNAVAILABLE, f"sandbox {box.sandbox.sandbox_id} exited: {reason}")

    async def Exec(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle() -> Any:
            box = self._box(request.sandbox_id, running=True)
            if self.faults.die_during_exec:
                await self._died(box)
            # the service drains past max_output_bytes and counts (``*_bytes_produced``): the command is
            # not ended at the cap; only the answer is cut (the local sandbox bounds the drain at DRAIN_CAP)
            req = self._exec_request(box, request.command, request.env, None, DRAIN_CAP, context)
            self.active_execs += 1
            try:
                ex = await self.local.exec(box.local_id, req)
            except SandboxNotRunningError as exc:
                raise Abort(C.FAILED_PRECONDITION, str(exc), "CWSANDBOX_SANDBOX_NOT_RUNNING") from exc
            except SandboxError as exc:  # the local sandbox broke: the service's internal failure
                raise Abort(C.INTERNAL, f"runner failed: {exc}") from exc
            finally:
                self.active_execs -= 1
            cap = request.max_output_bytes or DRAIN_CAP
            response = pb.ExecResponse(
                stdout=ex.stdout[:cap],
                stderr=ex.stderr[:cap],
                exit_code=_exit_code(ex.returncode),
                stdout_truncated=len(ex.stdout) > cap,
                stderr_truncated=len(ex.stderr) > cap,
                stdout_bytes_produced=len(ex.stdout),
                stderr_bytes_produced=len(ex.stderr),
            )
            self.exec_responses.append(response)
            return response

        return await self._serve("Exec", request, context, handle)

    async def StreamExec(self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        first = await anext(aiter(request_iterator), None)
        try:
            await self._enter("StreamExec", first, context)
            if first is None or first.WhichOneof("message") != "init":
                raise Abort(C.INVALID_ARGUMENT, "the first message must be init", "CWSANDBOX_INVALID_REQUEST")
            init = first.init
            box = self._box(init.sandbox_id, running=True)
            await context.write(pb.ExecStreamResponse(ready=pb.ExecStreamReady(ready_time=now())))
            stdin = bytearray()
            async for msg in request_iterator:
                self.requests.append(Record("StreamExec.message", msg, {}))
                kind = msg.WhichOneof("message")
                if kind == "stdin":
                    stdin += msg.stdin
                elif kind == "close":
                    break
            if self.faults.die_during_exec:
                await self._died(box)
            req = self._exec_request(box, init.command, init.env, bytes(stdin) or None, 0, context)
            await self._stream(box, req, context)
        except Abort as exc:
            await context.abort(exc.code, exc.message, trailing_metadata=exc.trailers())

    async def _stream(self, box: Box, req: ExecRequest, context: grpc.aio.ServicerContext) -> None:
        frames = 0
        faults = self.faults
        cut = faults.cut_stream_after

        class Cut(Exception):
            pass

        class Ended(Exception):
            pass

        async def on_output(stream: str, data: bytes) -> None:
            nonlocal frames
            if cut is not None and frames >= cut:
                raise Cut
            if faults.end_stream_on is not None and faults.end_stream_on in data:
                raise Ended
            kind = pb.ExecStreamOutput.STREAM_STDOUT if stream == "stdout" else pb.ExecStreamOutput.STREAM_STDERR
            await context.write(pb.ExecStreamResponse(output=pb.ExecStreamOutput(stream=kind, data=data)))
            frames += 1

        self.active_execs += 1
        try:
            ex = await self.local.exec(box.local_id, req, on_output)
        except Ended:
            return  # the program's output ended the stream: OK, no exit frame
        except Cut:
            faults.cut_stream_after = None
            if faults.cut_code is not None:
                raise Abort(faults.cut_code, "stream cut (injected)") from None
            return  # an OK end with no exit frame
        except SandboxNotRunningError as exc:
            raise Abort(C.FAILED_PRECONDITION, str(exc), "CWSANDBOX_SANDBOX_NOT_RUNNING") from exc
        except SandboxError as exc:  # the local sandbox broke: the service's internal failure
            raise Abort(C.INTERNAL, f"runner failed: {exc}") from exc
        finally:
            self.active_execs -= 1
        if faults.stream_error_code is not None:
            code, faults.stream_error_code = faults.stream_error_code, None
            await context.write(pb.ExecStreamResponse(error=pb.ExecStreamError(code=code, message="injected")))
            return
        exit_frame = pb.ExecStreamExit(exit_code=_exit_code(ex.returncode), completed_time=now())
        await context.write(pb.ExecStreamResponse(exit=exit_frame))


def _exit_code(returncode: int) -> int:
    """The shell's view of a signal death (128 + n), as a container runtime reports it."""
    return 128 - returncode if returncode < 0 else returncode
