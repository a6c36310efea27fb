"""Why did an exec fail? A dead sandbox beats a broken stream; an OOM kill is the program's outcome.

Called when an exec call failed or its stream ended without an exit status. One
``GetSandbox`` decides:

- the sandbox is RUNNING and the call failed with a status: the transport or the service
  failed (the call's own error, translated);
- the sandbox is RUNNING and the stream ended without an exit status and without an error
  (never exit 0): that alone is no evidence against the platform, since a program might be
  able to make the service end its stream, and a masked failure is worth a reward to it. So a
  probe exec (``true``) follows: if the probe fails with an error status and a second
  ``GetSandbox`` still finds the sandbox RUNNING, the service is failing
  (``SandboxTransportError``, infrastructure; a sandbox that died meanwhile is judged as
  below, so an OOM kill stays the program's); otherwise (the probe ran, or it too
  ended without a status, which the program's leftovers could cause) the lost stream is the
  program's (``SandboxTransportError(infrastructure=False)``). An in-band stream error from
  the service (other than the output-cap ones ``_exec`` handles) is the service's word, so
  infrastructure;
- it is gone and its ``state_reason`` says OOM: the command's memory use killed it, so the
  result is ``ExecExit(oom_killed=True)`` with the output so far (the program's outcome,
  never infrastructure: a policy must not learn that eating memory masks its failure);
- it was destroyed by this client: ``SandboxTerminatedError``;
- otherwise (evicted, node lost, TTL): ``SandboxNotRunningError``, infrastructure. The
  sandbox's PID 1 has no signal handlers, so the program cannot end it itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

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
    probe: Callable[[], Awaitable[ExecOutcome]],
) -> ExecExit:
    """The ``ExecExit`` of an OOM-killed command, or raise the error that says what failed."""
    error = out.error
    what = "exec" if error is None else f"exec ({error.failure.code.name})"
    sandbox = await _get(channel, sandbox_id, service_id, error)
    if _running(sandbox):
        if error is not None:
            raise translate(error.failure, "exec", sandbox_id=sandbox_id) from error.cause
        text = f"exec stream of {sandbox_id} ended without an exit status"
        if out.stream_error is not None:
            code, message = out.stream_error
            raise SandboxTransportError(f"{text}: the service said {code} {message}".rstrip(), sandbox_id=sandbox_id)
        checked = await probe()
        if checked.error is None:
            seen = "ran" if checked.exit_code is not None else "ended without a status too"
            log.info("coreweave lost exec stream judged the program's", sandbox_id=sandbox_id, probe=seen)
            raise SandboxTransportError(
                f"{text} while its sandbox was running (a probe exec {seen}): counted as the program's failure",
                sandbox_id=sandbox_id,
                infrastructure=False,
            )
        failure = checked.error.failure
        log.info("coreweave probe exec failed after a lost stream", sandbox_id=sandbox_id, code=failure.code.name)
        sandbox = await _get(channel, sandbox_id, service_id, None)  # did the sandbox die meanwhile?
        if _running(sandbox):
            raise SandboxTransportError(
                f"{text}, and a probe exec failed too: {failure.describe('probe')}", sandbox_id=sandbox_id
            )
    status = status_of(sandbox.status.state) if sandbox is not None else SandboxStatus.COMPLETED
    reason = sandbox.status.state_reason if sandbox is not None else "gone"
    if "oom" in reason.lower():
        log.info("coreweave sandbox OOM-killed during exec", sandbox_id=sandbox_id, reason=reason)
        cap = request.max_output_bytes
        return ExecExit(-9, bytes(out.stdout[:cap]), bytes(out.stderr[:cap]), wall, oom_killed=True)
    if destroyed:
        raise SandboxTerminatedError(f"sandbox {sandbox_id} was destroyed", sandbox_id=sandbox_id)
    raise SandboxNotRunningError(f"{what}: sandbox {sandbox_id} is {status.value} ({reason})", sandbox_id=sandbox_id)


def _running(sandbox: Any) -> bool:
    return sandbox is not None and status_of(sandbox.status.state) is SandboxStatus.RUNNING


async def _get(channel: Channel, sandbox_id: str, service_id: str, error: RpcError | None) -> Any:
    """The sandbox (None once the service no longer knows it); a failed look-up raises the exec's own
    error if it had one, else the look-up's."""
    from cwsandbox._proto import sandbox_pb2 as pb

    try:
        return await channel.unary("GetSandbox", pb.GetSandboxRequest(sandbox_id=service_id))
    except RpcError as exc:
        if exc.failure.code.name == "NOT_FOUND":
            return None
        if error is not None:
            raise translate(error.failure, "exec", sandbox_id=sandbox_id) from error.cause
        raise translate(exc.failure, "get sandbox", sandbox_id=sandbox_id) from exc.cause
