"""The test server's fault model and its AIP-193 error answers.

``Faults`` is mutable on purpose: a test sets a field, the next matching call sees it.
Errors go out the way the service sends them: a gRPC status plus trailing
``grpc-status-details-bin`` holding a ``google.rpc.Status`` with an ``ErrorInfo``
(domain ``cwsandbox.com``) and optionally a ``RetryInfo``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

DOMAIN = "cwsandbox.com"


@dataclass
class Faults:
    """What the server does wrong, and how often (counts go down as faults are served)."""

    #: method -> how many calls to answer UNAVAILABLE (with reason CWSANDBOX_BACKEND_UNAVAILABLE)
    unavailable: dict[str, int] = field(default_factory=dict)
    #: method -> how many calls to answer UNAVAILABLE with no details (a broken connection)
    bare_unavailable: dict[str, int] = field(default_factory=dict)
    #: method -> how many calls to serve, then answer UNAVAILABLE anyway (the answer was lost)
    lose_responses: dict[str, int] = field(default_factory=dict)
    #: method -> how many calls to answer RESOURCE_EXHAUSTED with a RetryInfo of ``retry_delay``
    exhausted: dict[str, int] = field(default_factory=dict)
    retry_delay: float = 0.05
    #: seconds a new sandbox stays CREATING before it is RUNNING (a slow image pull)
    start_delay: float = 0.0
    #: a new sandbox goes FAILED with this state_reason instead of RUNNING
    fail_start: str | None = None
    #: DeleteSandbox calls answered OK without deleting anything
    lost_deletes: int = 0
    #: StreamExec: after this many output frames, cut the stream (``cut_code`` None: end it with OK
    #: and no exit frame; else abort with that code)
    cut_stream_after: int | None = None
    cut_code: grpc.StatusCode | None = grpc.StatusCode.UNAVAILABLE
    #: StreamExec: when a command's output contains these bytes, end its stream with OK and no exit frame
    #: (a service whose stream a program can end, e.g. by killing the process that carries it; stays set)
    end_stream_on: bytes | None = None
    #: StreamExec: end with this in-band ExecStreamError code (e.g. STREAM_BACKPRESSURE) instead of exit
    stream_error_code: str | None = None
    #: Exec/StreamExec: the sandbox dies during the next exec with this state_reason (e.g. OOMKilled)
    die_during_exec: str | None = None
    #: method -> seconds to stall before answering
    stall: dict[str, float] = field(default_factory=dict)

    def take(self, counter: dict[str, int], method: str) -> bool:
        left = counter.get(method, 0)
        if left <= 0:
            return False
        counter[method] = left - 1
        return True


def status_details(
    code: grpc.StatusCode, message: str, reason: str | None, retry_delay: float | None = None
) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata carrying a ``google.rpc.Status`` with ErrorInfo/RetryInfo details."""
    details = []
    if reason is not None:
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN))
        details.append(info)
    if retry_delay is not None:
        retry = any_pb2.Any()
        seconds = int(retry_delay)
        delay = duration_pb2.Duration(seconds=seconds, nanos=int((retry_delay - seconds) * 1e9))
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    status = status_pb2.Status(code=code.value[0], message=message, details=details)
    return (("grpc-status-details-bin", status.SerializeToString()),)


class Abort(Exception):
    """Raised inside a handler: the server answers with this status and details."""

    def __init__(
        self, code: grpc.StatusCode, message: str, reason: str | None = None, retry_delay: float | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.retry_delay = retry_delay

    def trailers(self) -> tuple[tuple[str, bytes], ...]:
        if self.reason is None and self.retry_delay is None:
            return ()
        return status_details(self.code, self.message, self.reason, self.retry_delay)
