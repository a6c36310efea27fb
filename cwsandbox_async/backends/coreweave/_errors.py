"""gRPC failures of the CoreWeave Sandbox service, translated into the library's exception tree.

The one foreign exception this backend knows is ``grpc.aio.AioRpcError`` (a call that
ended with a non-OK status). Its trailing ``grpc-status-details-bin`` holds a
``google.rpc.Status`` whose details may carry an AIP-193 ``ErrorInfo`` (``reason`` is
honoured only for the domain ``cwsandbox.com``, as the SDK does) and a ``RetryInfo``
(the delay the service asks for). ``RpcFailure.parse`` reads them; ``translate`` picks
the class from an explicit table of every gRPC status code. Any other exception is a
bug and propagates unchanged.

``infrastructure`` follows ``backends/base.py``: True only for what neither the program
under test nor the caller could cause (the service is down, overloaded, failed
internally, or the sandbox died for outside reasons); False for the caller's mistakes
(bad request, bad credentials, a sandbox it already stopped).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from ..._errors import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxError,
    SandboxFileError,
    SandboxNotRunningError,
    SandboxTimeoutError,
    SandboxTransportError,
    SandboxValidationError,
)

__all__ = ["DOMAIN", "RpcFailure", "translate"]

DOMAIN = "cwsandbox.com"
_DETAILS_KEY = "grpc-status-details-bin"
C = grpc.StatusCode

#: Reasons under which a failed create/exec was refused before anything ran (safe to retry).
CAPACITY_REASONS = frozenset(
    {
        "CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED",
        "CWSANDBOX_RUNNER_OVERLOADED",
        "CWSANDBOX_RUNNER_UNAVAILABLE",
        "CWSANDBOX_BACKEND_UNAVAILABLE",
        "CWSANDBOX_RUNNER_SHARD_RETIRING",
        "CWSANDBOX_NO_SUITABLE_RUNNER",
    }
)
FILE_REASONS = frozenset(
    {
        "CWSANDBOX_FILE_NOT_FOUND",
        "CWSANDBOX_FILE_IS_DIRECTORY",
        "CWSANDBOX_FILE_IO_FAILED",
        "CWSANDBOX_FILE_PERMISSION_DENIED",
        "CWSANDBOX_FILE_TOO_LARGE",
    }
)
#: Codes that mean "the service did not take the request; ask again later".
RETRYABLE_CODES = frozenset({C.UNAVAILABLE, C.RESOURCE_EXHAUSTED})


@dataclass(frozen=True, slots=True)
class RpcFailure:
    """What a failed call said: its code and message, and the AIP-193 details if any."""

    code: grpc.StatusCode
    message: str
    reason: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    retry_delay: float | None = None
    #: The service attached structured details (so it, not the transport, answered).
    from_service: bool = False

    @classmethod
    def parse(cls, exc: grpc.aio.AioRpcError) -> RpcFailure:
        code, message = exc.code(), exc.details() or ""
        raw = next((v for k, v in (exc.trailing_metadata() or ()) if k == _DETAILS_KEY), None)
        if not isinstance(raw, bytes):
            return cls(code, message)
        status = status_pb2.Status()
        try:
            status.ParseFromString(raw)
        except DecodeError:
            return cls(code, message)
        reason: str | None = None
        meta: dict[str, str] = {}
        delay: float | None = None
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == DOMAIN:
                    reason, meta = info.reason or None, dict(info.metadata)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                delay = max(0.0, retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9)
        return cls(code, message or status.message, reason, meta, delay, from_service=True)

    @property
    def retryable(self) -> bool:
        """Refused before it ran: UNAVAILABLE or RESOURCE_EXHAUSTED, the latter only when the service
        said so (a RetryInfo or a capacity reason; a client-side message-size overflow has neither)."""
        if self.code is C.UNAVAILABLE:
            return True
        return self.code is C.RESOURCE_EXHAUSTED and (self.retry_delay is not None or self.reason in CAPACITY_REASONS)

    @property
    def refused_before_start(self) -> bool:
        """The service (not a broken connection) refused the call, so a non-idempotent call may be re-sent."""
        return self.retryable and (self.code is C.RESOURCE_EXHAUSTED or self.from_service)

    def describe(self, what: str) -> str:
        tail = f" [{self.reason}]" if self.reason else ""
        return f"{what}: {self.code.name} {self.message}{tail}".rstrip()


def translate(
    failure: RpcFailure, what: str, *, sandbox_id: str | None = None, path: str | None = None
) -> SandboxError:
    """The library error for a failed call ``what`` (e.g. ``"create sandbox"``). Never raises."""
    code, reason, text = failure.code, failure.reason, failure.describe(what)
    if reason in FILE_REASONS or (path is not None and code in (C.NOT_FOUND, C.PERMISSION_DENIED)):
        if reason == "CWSANDBOX_FILE_IO_FAILED":
            return SandboxTransportError(text, sandbox_id=sandbox_id)
        return SandboxFileError(text, sandbox_id=sandbox_id, path=path)
    if reason == "CWSANDBOX_COMMAND_TIMEOUT":
        return SandboxTimeoutError(text, sandbox_id=sandbox_id, infrastructure=False)
    if code is C.NOT_FOUND or reason == "CWSANDBOX_SANDBOX_NOT_FOUND":
        return SandboxNotRunningError(text, sandbox_id=sandbox_id)
    if code is C.FAILED_PRECONDITION:
        return SandboxNotRunningError(text, sandbox_id=sandbox_id)
    if code in (C.UNAUTHENTICATED, C.PERMISSION_DENIED):
        return SandboxBackendUnavailableError(
            f"{text} (check CWSANDBOX_API_KEY / the W&B credentials)", sandbox_id=sandbox_id, infrastructure=False
        )
    if code in (C.INVALID_ARGUMENT, C.OUT_OF_RANGE):
        return SandboxValidationError(text, sandbox_id=sandbox_id)
    if code is C.ALREADY_EXISTS:
        return SandboxCreationError(text, sandbox_id=sandbox_id, reason=reason or code.name)
    if code is C.UNIMPLEMENTED:
        return SandboxBackendUnavailableError(f"{text} (the service does not offer this call)", sandbox_id=sandbox_id)
    if code is C.DEADLINE_EXCEEDED:
        return SandboxTimeoutError(text, sandbox_id=sandbox_id, infrastructure=True)
    if code is C.RESOURCE_EXHAUSTED and reason in CAPACITY_REASONS and what.startswith("create"):
        return SandboxCreationError(text, sandbox_id=sandbox_id, reason=reason)
    if code in (C.UNAVAILABLE, C.RESOURCE_EXHAUSTED) and what.startswith(("create", "list", "delete", "purge")):
        return SandboxBackendUnavailableError(text, sandbox_id=sandbox_id)
    # UNAVAILABLE / RESOURCE_EXHAUSTED on the data plane, ABORTED, CANCELLED (by the server),
    # INTERNAL, UNKNOWN, DATA_LOSS, and OK-with-an-error (impossible): the platform failed.
    if code in (C.UNAVAILABLE, C.RESOURCE_EXHAUSTED, C.ABORTED, C.CANCELLED, C.INTERNAL, C.UNKNOWN, C.DATA_LOSS):
        return SandboxTransportError(text, sandbox_id=sandbox_id)
    return SandboxTransportError(f"{text} (unexpected status)", sandbox_id=sandbox_id)
