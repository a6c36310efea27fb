"""A plain CoreWeave Sandbox service on loopback for bench_coreweave: favours neither client.

An independent implementation of the service's protocol, sharing no code with this project (it
imports only ``grpc`` and the protocol modules the ``cwsandbox`` wheel ships): a ``grpc.aio``
server that serves only the RPCs the ``cwsandbox`` SDK calls (CreateSandbox, GetSandbox,
ListSandboxes, DeleteSandbox, StreamExec, ReadFile, WriteFile; everything else, unary ``Exec``
and ``PurgeSandboxes`` included, answers UNIMPLEMENTED from the generated servicer). Sandboxes
are records: a create is RUNNING at once, files live in a dict, and every ``StreamExec`` is
answered at once with ``ready``, one stdout frame, ``exit`` 0, then its OK status, whatever the
command. So a client's CPU per exec here is its own, not the cost of a server's latency.

    python -m benchmarks._plain_server   # prints http://127.0.0.1:PORT, serves until its stdin closes
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import time
from typing import Any

import grpc
import grpc.aio
from cwsandbox._proto import sandbox_pb2 as pb
from cwsandbox._proto import sandbox_pb2_grpc as pb_grpc
from google.protobuf import timestamp_pb2

TERMINAL = (pb.STATE_COMPLETED, pb.STATE_FAILED, pb.STATE_TERMINATED)
OUTPUT = b"ok\n"


def _now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return ts


class PlainService(pb_grpc.SandboxServiceServicer):
    """The SDK's RPCs over in-memory records (no auth check: any Bearer token is accepted)."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, Any] = {}
        self.files: dict[tuple[str, str], bytes] = {}
        self.by_request: dict[str, str] = {}
        self.ids = itertools.count(1)

    def _get(self, sandbox_id: str) -> Any:
        return self.sandboxes.get(sandbox_id)

    async def CreateSandbox(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        known = self.by_request.get(request.request_id) if request.request_id else None
        if known is not None:
            return self.sandboxes[known]
        sid = f"plain-{next(self.ids)}"
        sandbox = pb.Sandbox(sandbox_id=sid, spec=request.sandbox.spec)
        sandbox.status.state = pb.STATE_RUNNING
        sandbox.status.create_time.CopyFrom(_now())
        sandbox.status.start_time.CopyFrom(_now())
        self.sandboxes[sid] = sandbox
        if request.request_id:
            self.by_request[request.request_id] = sid
        return sandbox

    async def GetSandbox(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        sandbox = self._get(request.sandbox_id)
        if sandbox is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {request.sandbox_id} not found")
        return sandbox

    async def ListSandboxes(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        wanted = set(request.tags)
        found = [
            sb
            for sb in self.sandboxes.values()
            if wanted <= set(sb.spec.tags)
            and (not request.state or sb.status.state == request.state)
            and (request.show_terminated or sb.status.state not in TERMINAL)
        ]
        size = request.page_size or 100
        start = int(request.page_token or 0)
        token = str(start + size) if start + size < len(found) else ""
        return pb.ListSandboxesResponse(sandboxes=found[start : start + size], next_page_token=token)

    async def DeleteSandbox(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        sandbox = self._get(request.sandbox_id)
        if sandbox is None:
            if request.allow_missing:
                return pb.DeleteSandboxResponse()
            await context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {request.sandbox_id} not found")
        if sandbox.status.state not in TERMINAL:
            sandbox.status.state = pb.STATE_COMPLETED
            sandbox.status.end_time.CopyFrom(_now())
        return pb.DeleteSandboxResponse(sandbox=sandbox)

    async def StreamExec(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("message") != "init":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be init")
            return
        sandbox = self._get(first.init.sandbox_id)
        if sandbox is None or sandbox.status.state != pb.STATE_RUNNING:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "sandbox is not running")
        await context.write(pb.ExecStreamResponse(ready=pb.ExecStreamReady(ready_time=_now())))
        out = pb.ExecStreamOutput(stream=pb.ExecStreamOutput.STREAM_STDOUT, data=OUTPUT)
        await context.write(pb.ExecStreamResponse(output=out))
        await context.write(pb.ExecStreamResponse(exit=pb.ExecStreamExit(exit_code=0, completed_time=_now())))

    async def ReadFile(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        data = self.files.get((request.sandbox_id, request.path))
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{request.path}: no such file")
        return pb.ReadFileResponse(content=data)

    async def WriteFile(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.files[(request.sandbox_id, request.path)] = bytes(request.content)
        return pb.WriteFileResponse()


async def serve() -> None:
    server = grpc.aio.server()
    register: Any = pb_grpc.add_SandboxServiceServicer_to_server  # generated code, untyped
    register(PlainService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"http://127.0.0.1:{port}", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_for_eof, name="stdin-eof", daemon=True).start()
    await stop.wait()
    await server.stop(grace=None)


if __name__ == "__main__":
    asyncio.run(serve())
