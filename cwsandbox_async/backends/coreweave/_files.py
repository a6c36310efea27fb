"""Files through the service's unary ``ReadFile`` / ``WriteFile`` RPCs.

``read_file`` refuses a file larger than ``max_bytes`` after it arrived (the service
has no size-limited read; ``max_message_bytes`` bounds what a call can carry).
``write_file`` replaces the file; when the service answers that the parent directory
does not exist, the backend creates it (``mkdir -p`` through exec) and writes once more.
"""

from __future__ import annotations

import posixpath

from ..._errors import SandboxFileError
from ._channel import Channel

__all__ = ["mkdir_argv", "read", "too_large", "write"]


def mkdir_argv(path: str) -> list[str]:
    """The argv that creates the parent directory of ``path``."""
    return ["mkdir", "-p", "--", posixpath.dirname(path) or "/"]


def too_large(sandbox_id: str, path: str, size: int, max_bytes: int) -> SandboxFileError:
    return SandboxFileError(
        f"{path} is {size} bytes, more than the {max_bytes} allowed", sandbox_id=sandbox_id, path=path
    )


async def read(channel: Channel, service_id: str, path: str, deadline: float) -> bytes:
    """The file's bytes; ``RpcError`` as the service answered."""
    from cwsandbox._proto import sandbox_pb2

    resp = await channel.unary(
        "ReadFile", sandbox_pb2.ReadFileRequest(sandbox_id=service_id, path=path), deadline=deadline
    )
    return bytes(resp.content)


async def write(channel: Channel, service_id: str, path: str, data: bytes, deadline: float) -> None:
    """Replace the file (idempotent, so retried like a read); ``RpcError`` as the service answered."""
    from cwsandbox._proto import sandbox_pb2

    msg = sandbox_pb2.WriteFileRequest(sandbox_id=service_id, path=path, content=data)
    await channel.unary("WriteFile", msg, deadline=deadline)
