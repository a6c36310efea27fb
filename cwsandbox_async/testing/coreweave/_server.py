"""A CoreWeave Sandbox service on 127.0.0.1 for tests: the real protocol, real sandboxes.

A ``grpc.aio`` server whose ``SandboxService`` servicer subclasses the generated
``SandboxServiceServicer`` of the ``cwsandbox`` wheel (the same protocol modules the
backend uses, and the ones the unmodified SDK uses). Every sandbox is a real local
sandbox of this project's local backend (bubblewrap namespaces); exec and file calls
run there.

Which RPCs it serves (``rpcs``): ``"sdk"`` (the default) serves only what the ``cwsandbox``
SDK 1.22 calls, the calls the service is known to answer: Create (idempotent by
``request_id``), Get, List (tags, state, show_terminated, pages), Delete, StreamExec,
ReadFile, WriteFile. ``"all"`` adds the protocol's unary ``Exec`` and ``PurgeSandboxes``,
which no known client uses. Everything else (ConnectSandbox included, so the SDK falls
back to this gateway) answers UNIMPLEMENTED, as an RPC the service does not offer would.

Every call is recorded (``requests``: method, message, metadata); ``faults`` injects
failures (see ``faults.Faults``). Semantics chosen where the protocol leaves them open:
unary Exec drains a command's output past ``max_output_bytes`` and only cuts the answer
(as ``*_bytes_produced`` suggests), so the backend's own in-sandbox cap is what stops a
flood; StreamExec starts the command once the client half-closes stdin; WriteFile creates
parent directories unless ``write_creates_parents=False``. It proves protocol use, not the service's behaviour.

    python -m cwsandbox_async.testing.coreweave   # prints http://127.0.0.1:PORT, serves until Ctrl-C / SIGTERM
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
from cwsandbox._proto import sandbox_pb2 as pb
from cwsandbox._proto import sandbox_pb2_grpc as pb_grpc

from cwsandbox_async._errors import SandboxError, SandboxFileError
from cwsandbox_async._types import ExecRequest, Resources, SandboxDefaults, SandboxSpec
from cwsandbox_async.backends import Backend, load_backend

from ._exec import ExecHandlers
from ._faults import Abort, Faults
from ._state import TERMINAL, Box, Record, now

C = grpc.StatusCode
#: ReadFile/WriteFile refuse more than this (the SDK's unary cap).
FILE_CAP = 32 * 1024 * 1024
#: The RPCs the ``cwsandbox`` 1.22 SDK calls (it never calls unary ``Exec`` or ``PurgeSandboxes``).
SDK_RPCS = frozenset(
    {"CreateSandbox", "GetSandbox", "ListSandboxes", "DeleteSandbox", "StreamExec", "ReadFile", "WriteFile"}
)
#: ``rpcs="all"``: the SDK's, plus the protocol's unary ``Exec`` and ``PurgeSandboxes``.
ALL_RPCS = SDK_RPCS | {"Exec", "PurgeSandboxes"}
RPC_MODES = {"sdk": SDK_RPCS, "all": ALL_RPCS}


class SandboxService(ExecHandlers, pb_grpc.SandboxServiceServicer):
    """The servicer. ``local`` runs the sandboxes; ``api_key`` (if set) is required as a Bearer token;
    ``rpcs`` (``"sdk"`` or ``"all"``) says which RPCs it serves (the others answer UNIMPLEMENTED)."""

    def __init__(
        self, local: Backend, *, api_key: str | None = None, write_creates_parents: bool = True, rpcs: str = "sdk"
    ) -> None:
        if rpcs not in RPC_MODES:
            raise ValueError(f"rpcs must be one of {', '.join(RPC_MODES)}, got {rpcs!r}")
        self.local = local
        self.api_key = api_key
        self.rpcs = RPC_MODES[rpcs]
        self.write_creates_parents = write_creates_parents
        self.faults = Faults()
        self.requests: list[Record] = []
        self.boxes: dict[str, Box] = {}
        self._by_request: dict[str, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self.active_execs = 0
        #: calls of each method open at once, now and at the most
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        #: every unary Exec answer sent (``*_bytes_produced`` tells how far a command got)
        self.exec_responses: list[Any] = []

    # -- helpers -----------------------------------------------------------------
    def calls(self, method: str) -> list[Any]:
        return [r.message for r in self.requests if r.method == method]

    def live(self) -> list[Box]:
        return [b for b in self.boxes.values() if b.state not in TERMINAL]

    async def _enter(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """Record, authenticate and apply this method's faults."""
        meta = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        self.requests.append(Record(method, request, meta))
        if method not in self.rpcs:
            raise Abort(C.UNIMPLEMENTED, f"Method not found: coreweave.sandbox.v1.SandboxService/{method}")
        if self.api_key is not None and meta.get("authorization") != f"Bearer {self.api_key}":
            raise Abort(C.UNAUTHENTICATED, "missing or wrong API key")
        f = self.faults
        if method in f.stall:
            await asyncio.sleep(f.stall[method])
        if f.take(f.unavailable, method):
            raise Abort(C.UNAVAILABLE, "backend unavailable (injected)", "CWSANDBOX_BACKEND_UNAVAILABLE", f.retry_delay)
        if f.take(f.bare_unavailable, method):
            raise Abort(C.UNAVAILABLE, "connection reset (injected)")
        if f.take(f.exhausted, method):
            raise Abort(C.RESOURCE_EXHAUSTED, "rate limited (injected)", None, f.retry_delay)

    async def _serve(
        self, method: str, request: Any, context: grpc.aio.ServicerContext, handler: Callable[[], Any]
    ) -> Any:
        self.in_flight[method] += 1
        self.peak[method] = max(self.peak[method], self.in_flight[method])
        try:
            await self._enter(method, request, context)
            answer = await handler()
            if self.faults.take(self.faults.lose_responses, method):
                raise Abort(C.UNAVAILABLE, "connection reset after the call was served (injected)")
            return answer
        except Abort as exc:
            await context.abort(exc.code, exc.message, trailing_metadata=exc.trailers())
        finally:
            self.in_flight[method] -= 1

    def _box(self, sandbox_id: str, *, running: bool = False) -> Box:
        box = self.boxes.get(sandbox_id)
        if box is None:
            raise Abort(C.NOT_FOUND, f"sandbox {sandbox_id} not found", "CWSANDBOX_SANDBOX_NOT_FOUND")
        if running and box.state != pb.STATE_RUNNING:
            name = pb.State.Name(box.state)
            raise Abort(C.FAILED_PRECONDITION, f"sandbox {sandbox_id} is {name}", "CWSANDBOX_SANDBOX_NOT_RUNNING")
        return box

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- lifecycle ---------------------------------------------------------------
    async def CreateSandbox(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle() -> Any:
            if request.request_id and request.request_id in self._by_request:
                return self.boxes[self._by_request[request.request_id]].sandbox  # idempotent retry
            spec = request.sandbox.spec
            if not spec.containers or not spec.containers[0].image:
                raise Abort(C.INVALID_ARGUMENT, "a container with an image is required", "CWSANDBOX_INVALID_REQUEST")
            sid = f"cw-{next(self._ids):05d}-{uuid.uuid4().hex[:6]}"
            sandbox = pb.Sandbox(sandbox_id=sid, spec=spec)
            sandbox.status.state = pb.STATE_CREATING
            sandbox.status.create_time.CopyFrom(now())
            if spec.max_lifetime_seconds:
                sandbox.status.effective_max_lifetime_seconds = spec.max_lifetime_seconds
            box = Box(sandbox, f"sbx-{sid}", request.request_id)
            self.boxes[sid] = box
            if request.request_id:
                self._by_request[request.request_id] = sid
            self._spawn(self._start(box))
            return sandbox

        return await self._serve("CreateSandbox", request, context, handle)

    async def _start(self, box: Box) -> None:
        container = box.sandbox.spec.containers[0]
        workdir = next((m.mount_path for m in container.volume_mounts), None) or container.working_dir or "/workspace"
        defaults = SandboxDefaults(
            env=dict(container.environment_variables), working_dir=workdir, resources=Resources()
        )
        try:
            await asyncio.sleep(self.faults.start_delay)
            if self.faults.fail_start is not None:
                box.set_state(pb.STATE_FAILED, self.faults.fail_start)
                return
            await self.local.create(SandboxSpec(box.local_id, "coreweave-test-server", defaults))
            if box.state == pb.STATE_CREATING:
                box.set_state(pb.STATE_RUNNING)
                box.sandbox.status.start_time.CopyFrom(now())
            else:  # deleted while starting
                await self.local.destroy(box.local_id)
        except SandboxError as exc:
            box.set_state(pb.STATE_FAILED, f"local sandbox failed: {exc}")
        finally:
            box.ready.set()

    async def GetSandbox(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle() -> Any:
            return self._box(request.sandbox_id).sandbox

        return await self._serve("GetSandbox", request, context, handle)

    async def ListSandboxes(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle() -> Any:
            wanted = set(request.tags)
            found = [
                b.sandbox
                for b in self.boxes.values()
                if wanted <= set(b.sandbox.spec.tags)
                and (not request.state or b.state == request.state)
                and (request.show_terminated or request.state in TERMINAL or b.state not in TERMINAL)
            ]
            size = min(request.page_size or 100, 1000)
            start = int(request.page_token or 0)
            page = found[start : start + size]
            token = str(start + size) if start + size < len(found) else ""
            return pb.ListSandboxesResponse(sandboxes=page, next_page_token=token)

        return await self._serve("ListSandboxes", request, context, handle)

    async def _terminate(self, box: Box) -> None:
        if box.state in TERMINAL:
            return
        box.set_state(pb.STATE_TERMINATING)
        await box.ready.wait()
        with contextlib.suppress(SandboxError):
            await self.local.destroy(box.local_id)
        if box.state == pb.STATE_TERMINATING:
            box.set_state(pb.STATE_COMPLETED)

    async def DeleteSandbox(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle() -> Any:
            box = self.boxes.get(request.sandbox_id)
            if box is None:
                if request.allow_missing:
                    return pb.DeleteSandboxResponse()
                raise Abort(C.NOT_FOUND, f"sandbox {request.sandbox_id} not found", "CWSANDBOX_SANDBOX_NOT_FOUND")
            if self.faults.lost_deletes > 0:
                self.faults.lost_deletes -= 1
                return pb.DeleteSandboxResponse(sandbox=box.sandbox)
            await self._terminate(box)
            return pb.DeleteSandboxResponse(sandbox=box.sandbox)

        return await self._serve("DeleteSandbox", request, context, handle)

    async def PurgeSandboxes(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle() -> Any:
            if not request.tags and not request.purge_all:
                raise Abort(C.INVALID_ARGUMENT, "tags or purge_all is required", "CWSANDBOX_INVALID_REQUEST")
            wanted = set(request.tags)
            victims = [b for b in self.live() if wanted <= set(b.sandbox.spec.tags)]
            if not request.dry_run:
                await asyncio.gather(*(self._terminate(b) for b in victims))
            return pb.PurgeSandboxesResponse(purge_count=len(victims))

        return await self._serve("PurgeSandboxes", request, context, handle)

    # -- files -------------------------------------------------------------------
    async def ReadFile(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle() -> Any:
            box = self._box(request.sandbox_id, running=True)
            try:
                data = await self.local.read_file(box.local_id, request.path, FILE_CAP)
            except SandboxFileError as exc:
                raise _file_abort(str(exc), request.path) from exc
            except SandboxError as exc:  # the local sandbox broke: the service's internal failure
                raise Abort(C.INTERNAL, f"runner failed: {exc}") from exc
            return pb.ReadFileResponse(content=data)

        return await self._serve("ReadFile", request, context, handle)

    async def WriteFile(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle() -> Any:
            box = self._box(request.sandbox_id, running=True)
            if len(request.content) > FILE_CAP:
                raise Abort(C.INVALID_ARGUMENT, "file too large", "CWSANDBOX_FILE_TOO_LARGE")
            if not self.write_creates_parents:
                parent = request.path.rsplit("/", 1)[0] or "/"
                probe = ExecRequest(("test", "-d", parent), "/", {}, None, 30.0, 1024)
                if (await self.local.exec(box.local_id, probe)).returncode != 0:
                    raise Abort(C.NOT_FOUND, f"no directory {parent}", "CWSANDBOX_FILE_NOT_FOUND")
            try:
                await self.local.write_file(box.local_id, request.path, bytes(request.content))
            except SandboxFileError as exc:
                raise _file_abort(str(exc), request.path) from exc
            except SandboxError as exc:  # the local sandbox broke: the service's internal failure
                raise Abort(C.INTERNAL, f"runner failed: {exc}") from exc
            return pb.WriteFileResponse()

        return await self._serve("WriteFile", request, context, handle)

    # -- shutdown ----------------------------------------------------------------
    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(self._terminate(b) for b in self.live()), return_exceptions=True)


def _file_abort(message: str, path: str) -> Abort:
    low = message.lower()
    if "directory" in low:
        return Abort(C.FAILED_PRECONDITION, message, "CWSANDBOX_FILE_IS_DIRECTORY")
    if "larger" in low or "too large" in low or "more than" in low:
        return Abort(C.FAILED_PRECONDITION, message, "CWSANDBOX_FILE_TOO_LARGE")
    if "permission" in low or "denied" in low or "read-only" in low:
        return Abort(C.PERMISSION_DENIED, message, "CWSANDBOX_FILE_PERMISSION_DENIED")
    return Abort(C.NOT_FOUND, f"{path}: {message}", "CWSANDBOX_FILE_NOT_FOUND")


class CoreWeaveTestServer:
    """``async with CoreWeaveTestServer() as server:`` serves on 127.0.0.1; ``server.url`` is its base URL.

    ``port`` 0 (the default) picks a free one; ``local`` runs the sandboxes (default: a local
    backend of its own, closed with the server); other keywords go to ``SandboxService``
    (``rpcs``, ``write_creates_parents``). Leaving the block destroys every sandbox it holds.
    """

    def __init__(
        self, *, api_key: str | None = None, local: Backend | None = None, port: int = 0, **service: Any
    ) -> None:
        self._own_local = local is None
        self.local = local or load_backend("local")
        self.service = SandboxService(self.local, api_key=api_key, **service)
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", 100 * 1024 * 1024)])
        register: Any = pb_grpc.add_SandboxServiceServicer_to_server  # generated code, untyped
        register(self.service, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(grace=None)
        await self.service.aclose()
        if self._own_local:
            await self.local.aclose()

    async def __aenter__(self) -> CoreWeaveTestServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
