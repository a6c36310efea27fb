"""Why did an exec fail? A dead sandbox beats a broken stream; an OOM kill is the program's outcome.

Called when an exec call failed or its stream ended without an exit status. One
``GetSandbox`` decides:

- the sandbox is RUNNING: the transport failed (the call's own error, or
  ``SandboxTransportError`` for a stream that ended without an exit status; never exit 0);
- it is gone and its ``state_reason`` says OOM: the command's memory use killed it, so the
  result is ``ExecExit(oom_killed=True)`` with the output so far (the program's outcome,
  never infrastructure: a policy must not learn that eating memory masks its failure);
- it was destroyed by this client: ``SandboxTerminatedError``;
- otherwise (evicted, node lost, TTL): ``SandboxNotRunningError``, infrastructure. The
  sandbox's PID 1 has no signal handlers, so the program cannot end it itself.
"""

from __future__ import annotations

from ..._errors import SandboxNotRunningError, SandboxTerminatedError, SandboxTransportError
from ..._log import log
from ..._types import ExecExit, ExecRequest, SandboxStatus
from ._channel import Channel, RpcError
from ._convert import status_of
from ._errors import translate
from ._exec import ExecOutcome

__all__ = ["diagnose"]


async def diagnose(
    channel: Channel,
    sandbox_id: str,
    service_id: str,
    request: ExecRequest,
    out: ExecOutcome,
    wall: float,
    *,
    destroyed: bool,
) -> ExecExit:
    """The ``ExecExit`` of an OOM-killed command, or raise the error that says what failed."""
    from cwsandbox._proto import sandbox_pb2 as pb

    error = out.error
    what = "exec" if error is None else f"exec ({error.failure.code.name})"
    try:
        sandbox = await channel.unary("GetSandbox", pb.GetSandboxRequest(sandbox_id=service_id))
    except RpcError as exc:
        sandbox = None
        if exc.failure.code.name != "NOT_FOUND":
            if error is not None:
                raise translate(error.failure, "exec", sandbox_id=sandbox_id) from error.cause
            raise translate(exc.failure, "get sandbox", sandbox_id=sandbox_id) from exc.cause
    status = status_of(sandbox.status.state) if sandbox is not None else SandboxStatus.COMPLETED
    if status is SandboxStatus.RUNNING:
        if error is not None:
            raise translate(error.failure, "exec", sandbox_id=sandbox_id) from error.cause
        raise SandboxTransportError(f"exec stream of {sandbox_id} ended without an exit status", sandbox_id=sandbox_id)
    reason = sandbox.status.state_reason if sandbox is not None else "gone"
    if "oom" in reason.lower():
        log.info("coreweave sandbox OOM-killed during exec", sandbox_id=sandbox_id, reason=reason)
        cap = request.max_output_bytes
        return ExecExit(-9, bytes(out.stdout[:cap]), bytes(out.stderr[:cap]), wall, oom_killed=True)
    if destroyed:
        raise SandboxTerminatedError(f"sandbox {sandbox_id} was destroyed", sandbox_id=sandbox_id)
    raise SandboxNotRunningError(f"{what}: sandbox {sandbox_id} is {status.value} ({reason})", sandbox_id=sandbox_id)
