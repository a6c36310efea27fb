"""The test server's records: calls received and sandboxes held."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from cwsandbox._proto import sandbox_pb2 as pb
from google.protobuf import timestamp_pb2

__all__ = ["TERMINAL", "Box", "Record", "now"]

TERMINAL = (pb.STATE_COMPLETED, pb.STATE_FAILED, pb.STATE_TERMINATED)


@dataclass
class Record:
    """One received call."""

    method: str
    message: Any
    metadata: dict[str, str]
    at: float = field(default_factory=time.monotonic)


@dataclass
class Box:
    """One sandbox: its protobuf view and the local sandbox behind it."""

    sandbox: Any
    local_id: str
    request_id: str
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    execs: int = 0

    @property
    def state(self) -> int:
        return int(self.sandbox.status.state)

    def set_state(self, state: int, reason: str = "") -> None:
        self.sandbox.status.state = state
        if reason:
            self.sandbox.status.state_reason = reason
        if state in TERMINAL:
            self.sandbox.status.end_time.CopyFrom(now())


def now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return ts
