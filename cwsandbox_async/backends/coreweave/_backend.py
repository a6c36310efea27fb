"""CoreWeaveBackend: sandboxes on the CoreWeave Sandbox service, asyncio-native over its gRPC protocol."""

from __future__ import annotations

import builtins
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..._errors import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxError,
    SandboxFileError,
    SandboxNotRunningError,
    SandboxTerminatedError,
)
from ..._log import log
from ..._types import ExecExit, ExecRequest, SandboxInfo, SandboxSpec, SandboxStatus, StreamName
from ..._validate import validate_sweep
from .._shared import DestroyedIds, destroy_each, sweep_victims
from ..base import Backend, OutputCallback
from . import _files
from ._channel import Channel, RpcError
from ._convert import MANAGED_TAG, create_request, driver_tag, id_tag, sandbox_info, status_of
from ._diagnose import diagnose
from ._errors import translate
from ._exec import ExecOutcome, run_stream, run_unary, wrap
from ._options import CoreWeaveOptions
from ._ready import Readiness
from ._sweep import purge

__all__ = ["CoreWeaveBackend"]

#: Sandboxes per ``ListSandboxes`` page.
PAGE_SIZE = 500


class CoreWeaveBackend(Backend):
    """Sandboxes on the CoreWeave Sandbox service. Load it by name:
    ``Session(backend="coreweave", backend_options={...})``; options are ``CoreWeaveOptions`` fields.

    Where and who: ``base_url`` (default ``$CWSANDBOX_BASE_URL``, else
    ``https://api.cwsandbox.com``; ``http://`` = insecure, for local testing) and ``api_key``
    (default ``$CWSANDBOX_API_KEY``, sent as a Bearer token), or ``auth="wandb"`` with
    ``$WANDB_API_KEY`` (plus ``wandb_entity``/``wandb_project``), as the SDK does.

    Sandbox: ``SandboxDefaults.image`` (else ``image``, ``python:3.11``); ``Resources.cpu``
    and ``memory_mib`` as equal requests and limits; ``workspace_mib`` a scratch volume at
    the working directory; ``cpu_seconds`` and ``file_size_mib`` as ``ulimit`` of every
    exec; ``pids`` and ``tmp_mib`` are not enforced. ``max_lifetime_seconds`` is the
    service's TTL, tags are the service's tags, ``network=False`` denies egress and ingress.
    Created with an idempotency key (``request_id``), so a retried create never makes two.
    Ready when RUNNING, found by one ``ListSandboxes`` per ``ready_poll_seconds`` for all
    sandboxes starting at once.

    Exec: see ``_exec`` (unary ``Exec`` unless stdin or streaming needs ``StreamExec``;
    ``exec_rpc`` forces one). Files: ``ReadFile``/``WriteFile``. ``sweep`` and closing use
    ``PurgeSandboxes`` (one call) where it applies.

    API etiquette: every RPC has a deadline (``request_timeout_seconds``; exec: its
    timeout + ``exec_slack_seconds``; files: ``file_timeout_seconds``), at most
    ``max_in_flight`` at once, and retries of what the service refused (``UNAVAILABLE``,
    ``RESOURCE_EXHAUSTED`` honouring ``RetryInfo``), ``max_retries`` times.

    Failures: see ``_errors`` for the status table. A sandbox that fails to start raises
    ``SandboxCreationError`` with the service's reason; one that died raises
    ``SandboxNotRunningError``, except that a command whose sandbox was OOM-killed returns
    ``ExecExit(oom_killed=True)`` (the program's outcome, never infrastructure).
    """

    name = "coreweave"

    def __init__(self, **options: Any) -> None:
        self.options = CoreWeaveOptions.from_kwargs(options)
        self.driver_id = uuid.uuid4().hex[:12]
        self._channel: Channel | None = None
        self._readiness: Readiness | None = None
        self._ids: dict[str, str] = {}  # library id -> service id
        self._limits: dict[str, tuple[int | None, int | None]] = {}  # cpu_seconds, file_size_mib
        self._destroyed = DestroyedIds()  # status says COMPLETED; a create that lands late is deleted
        self._created_any = False
        self._closed = False

    @property
    def isolation(self) -> str:
        rc = self.options.runtime_class
        return f"coreweave sandbox (runtime_class={rc})" if rc else "coreweave sandbox"

    @property
    def channel(self) -> Channel | None:
        """The connection (None before the first call); ``channel.calls`` counts RPCs by method."""
        return self._channel

    @property
    def readiness(self) -> Readiness | None:
        return self._readiness

    # -- plumbing --------------------------------------------------------------
    def _ensure(self) -> Channel:
        if self._closed:
            raise SandboxBackendUnavailableError("the coreweave backend is closed", infrastructure=False)
        if self._channel is None:
            endpoint = self.options.endpoint()
            self._channel = Channel(self.options, endpoint, self.options.auth_metadata(endpoint))
            self._readiness = Readiness(self._list_own, self.options.ready_poll_seconds, self._starting)
            log.debug("coreweave backend connected", target=endpoint.target, secure=endpoint.secure)
        return self._channel

    @staticmethod
    def _starting(sandbox: Any) -> bool:
        return status_of(sandbox.status.state) is SandboxStatus.CREATING

    async def _pages(self, tags: Sequence[str], *, show_terminated: bool = False) -> builtins.list[Any]:
        from cwsandbox._proto import sandbox_pb2 as pb

        channel, found, token = self._ensure(), [], ""
        while True:
            req = pb.ListSandboxesRequest(
                page_size=PAGE_SIZE, page_token=token, tags=list(tags), show_terminated=show_terminated
            )
            resp = await channel.unary("ListSandboxes", req)
            found.extend(resp.sandboxes)
            token = resp.next_page_token
            if not token:
                return found

    async def _list_own(self) -> dict[str, Any]:
        try:
            # terminated ones too: a sandbox that failed to start must end its create's wait
            found = await self._pages([driver_tag(self.driver_id)], show_terminated=True)
            return {sb.sandbox_id: sb for sb in found}
        except RpcError as exc:
            raise translate(exc.failure, "list sandboxes") from exc

    async def _service_id(self, sandbox_id: str) -> str | None:
        """The service's id for a library id (looked up by its id tag if another process made it)."""
        known = self._ids.get(sandbox_id)
        if known is not None:
            return known
        try:
            found = await self._pages([MANAGED_TAG, id_tag(sandbox_id)])
        except RpcError as exc:
            raise translate(exc.failure, "list sandboxes", sandbox_id=sandbox_id) from exc
        alive = [sb for sb in found if not status_of(sb.status.state).is_terminal]
        if not alive:
            return None
        self._ids[sandbox_id] = alive[0].sandbox_id
        return str(alive[0].sandbox_id)

    async def _usable(self, sandbox_id: str) -> str:
        if sandbox_id in self._destroyed:
            raise SandboxTerminatedError(f"sandbox {sandbox_id} was destroyed", sandbox_id=sandbox_id)
        service_id = await self._service_id(sandbox_id)
        if service_id is None:
            raise SandboxNotRunningError(f"sandbox {sandbox_id} does not exist", sandbox_id=sandbox_id)
        return service_id

    # -- create ----------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> None:
        sid = spec.sandbox_id
        channel = self._ensure()
        request = create_request(spec, self.options, self.driver_id)
        res = spec.defaults.resources
        self._limits[sid] = (res.cpu_seconds, res.file_size_mib)
        self._created_any = True
        try:
            sandbox = await channel.unary("CreateSandbox", request)  # idempotent: one request_id for every retry
        except RpcError as exc:
            raise translate(exc.failure, "create sandbox", sandbox_id=sid) from exc
        service_id = sandbox.sandbox_id
        self._ids[sid] = service_id
        if sid in self._destroyed:  # destroyed while the create was in flight
            await self.destroy(sid)
            raise SandboxCreationError(f"sandbox {sid} was destroyed while it was created", sandbox_id=sid)
        if self._starting(sandbox):
            assert self._readiness is not None
            sandbox = await self._readiness.wait(service_id)
        status = status_of(sandbox.status.state)
        if status is not SandboxStatus.RUNNING:
            reason = sandbox.status.state_reason or status.value
            raise SandboxCreationError(f"sandbox {sid} did not start: {reason}", sandbox_id=sid, reason=reason)
        log.debug("coreweave sandbox running", sandbox_id=sid, service_id=service_id)

    # -- exec ------------------------------------------------------------------
    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        service_id = await self._usable(sandbox_id)
        channel = self._ensure()
        opts = self.options
        cpu, fsize = self._limits.get(sandbox_id, (None, None))
        streamed = opts.exec_rpc == "stream" or (opts.exec_rpc == "auto" and bool(request.stdin or on_output))
        argv = wrap(request, opts.kill_after_seconds, cpu_seconds=cpu, file_size_mib=fsize, cap_inside=not streamed)
        start = time.monotonic()
        if streamed:
            out = await self._stream_with_retries(channel, service_id, request, argv, on_output)
        else:
            out = await run_unary(channel, service_id, request, argv, opts.exec_slack_seconds)
        wall = time.monotonic() - start
        if out.error is not None:
            return await self._diagnose(sandbox_id, service_id, request, out, wall)
        if out.exit_code is None and not (out.deadline_hit or out.truncated):
            return await self._diagnose(sandbox_id, service_id, request, out, wall)
        result = out.judge(request, wall)
        if on_output is not None and not streamed:  # exec_rpc="unary": the output arrives at once
            streams: tuple[tuple[StreamName, bytes], ...] = (("stdout", result.stdout), ("stderr", result.stderr))
            for name, data in streams:
                if data:
                    await on_output(name, data)
        return result

    async def _diagnose(
        self, sandbox_id: str, service_id: str, request: ExecRequest, out: ExecOutcome, wall: float
    ) -> ExecExit:
        destroyed = sandbox_id in self._destroyed
        return await diagnose(self._ensure(), sandbox_id, service_id, request, out, wall, destroyed=destroyed)

    async def _stream_with_retries(
        self, channel: Channel, service_id: str, request: ExecRequest, argv: Sequence[str], on_output: Any
    ) -> ExecOutcome:
        """A stream the service refused before any frame (so before the command ran) is sent again."""

        async def attempt() -> ExecOutcome:
            out = await run_stream(channel, service_id, request, argv, self.options.exec_slack_seconds, on_output)
            if out.error is not None and not out.started and out.error.failure.refused_before_start:
                raise out.error
            return out

        try:
            result: ExecOutcome = await channel.retrying(False, "StreamExec")(attempt)
        except RpcError as exc:
            return ExecOutcome(error=exc)
        return result

    # -- files -----------------------------------------------------------------
    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        service_id = await self._usable(sandbox_id)
        try:
            data = await _files.read(self._ensure(), service_id, path, self.options.file_timeout_seconds)
        except RpcError as exc:
            raise translate(exc.failure, f"read {path}", sandbox_id=sandbox_id, path=path) from exc.cause
        if len(data) > max_bytes:
            raise _files.too_large(sandbox_id, path, len(data), max_bytes)
        return data

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        service_id = await self._usable(sandbox_id)
        channel, seconds = self._ensure(), self.options.file_timeout_seconds
        try:
            await _files.write(channel, service_id, path, data, seconds)
            return
        except RpcError as exc:
            error = translate(exc.failure, f"write {path}", sandbox_id=sandbox_id, path=path)
            if not (isinstance(error, SandboxFileError) and exc.failure.reason == "CWSANDBOX_FILE_NOT_FOUND"):
                raise error from exc.cause
        mkdir = ExecRequest(tuple(_files.mkdir_argv(path)), "/", {}, None, seconds, 64 * 1024)
        made = await self.exec(sandbox_id, mkdir)
        if made.returncode != 0:
            raise SandboxFileError(
                f"cannot create the directory of {path}: {made.stderr.decode(errors='replace').strip()}",
                sandbox_id=sandbox_id,
                path=path,
            )
        try:
            await _files.write(channel, service_id, path, data, seconds)
        except RpcError as exc:
            raise translate(exc.failure, f"write {path}", sandbox_id=sandbox_id, path=path) from exc.cause

    # -- destroy, status, list ---------------------------------------------------
    async def _delete(self, service_id: str, sandbox_id: str | None) -> None:
        from cwsandbox._proto import sandbox_pb2 as pb

        req = pb.DeleteSandboxRequest(sandbox_id=service_id, grace_period_seconds=0, allow_missing=True)
        try:
            await self._ensure().unary("DeleteSandbox", req)
        except RpcError as exc:
            if exc.failure.code.name != "NOT_FOUND":
                raise translate(exc.failure, "delete sandbox", sandbox_id=sandbox_id) from exc.cause

    async def destroy(self, sandbox_id: str) -> None:
        with self._destroyed.destroying(sandbox_id):  # a create still in flight deletes what it made
            service_id = self._ids.get(sandbox_id) or await self._service_id(sandbox_id)
            if service_id is not None:
                await self._delete(service_id, sandbox_id)
        self._ids.pop(sandbox_id, None)
        self._limits.pop(sandbox_id, None)

    async def status(self, sandbox_id: str) -> SandboxStatus:
        from cwsandbox._proto import sandbox_pb2 as pb

        if sandbox_id in self._destroyed:
            return SandboxStatus.COMPLETED
        service_id = await self._service_id(sandbox_id)
        if service_id is None:
            return SandboxStatus.COMPLETED
        try:
            sandbox = await self._ensure().unary("GetSandbox", pb.GetSandboxRequest(sandbox_id=service_id))
        except RpcError as exc:
            if exc.failure.code.name == "NOT_FOUND":
                return SandboxStatus.COMPLETED
            raise translate(exc.failure, "get sandbox", sandbox_id=sandbox_id) from exc.cause
        return status_of(sandbox.status.state)

    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        try:
            found = await self._pages([MANAGED_TAG, *tags])
        except RpcError as exc:
            raise translate(exc.failure, "list sandboxes") from exc.cause
        infos = []
        for sb in found:
            info = sandbox_info(sb, self.name)
            if info.status in (SandboxStatus.TERMINATING, SandboxStatus.COMPLETED, SandboxStatus.FAILED):
                continue
            if info.sandbox_id in self._destroyed:
                continue
            self._ids.setdefault(info.sandbox_id, sb.sandbox_id)
            infos.append(info)
        return infos

    # -- sweep -----------------------------------------------------------------
    def owns(self, sandbox_id: str) -> bool:
        """True for a sandbox this backend instance created and has not destroyed."""
        return sandbox_id in self._limits

    async def sweep(
        self, tags: Sequence[str] = (), *, older_than_seconds: float | None = None, include_own: bool = False
    ) -> builtins.list[str]:
        """Delete this library's sandboxes carrying all of ``tags`` (leftovers of crashed drivers), optionally
        only those older than ``older_than_seconds``; this backend's own only with ``include_own``. One
        ``PurgeSandboxes`` call when that selects exactly the victims (no age filter, nothing of this
        backend's to keep); otherwise one by one. A sandbox that cannot be deleted is logged and left out
        of the result. Returns the ids deleted."""
        wanted, min_age = validate_sweep(tags, older_than_seconds)
        infos = await self.list(wanted)
        victims = sweep_victims(infos, min_age, lambda sid: not include_own and self.owns(sid))
        channel = self._channel
        exact = victims and len(victims) == len(infos)
        if exact and channel is not None and await purge(channel, [MANAGED_TAG, *wanted]):
            for sid in victims:
                self._destroyed.add(sid)
                self._ids.pop(sid, None)
                self._limits.pop(sid, None)
            log.info("coreweave sweep", tags=list(wanted), swept=len(victims), purged=True)
            return victims
        swept = await destroy_each(victims, self.destroy, "coreweave")
        log.info("coreweave sweep", tags=list(wanted), swept=len(swept))
        return swept

    async def aclose(self) -> None:
        """Delete any sandbox of this backend still alive (``sweep_on_close``: one ``PurgeSandboxes``), close
        the channel. The caller bounds it (each RPC has its deadline too); failures are logged."""
        if self._closed:
            return
        channel = self._channel
        try:
            if channel is not None and self._created_any and self.options.sweep_on_close:
                try:
                    if not await purge(channel, [driver_tag(self.driver_id)]):
                        for sb in await self._pages([driver_tag(self.driver_id)]):
                            await self._delete(sb.sandbox_id, None)
                except SandboxError as exc:
                    log.warning("coreweave final sweep failed", error=repr(exc))
        finally:
            self._closed = True
            if channel is not None:
                await channel.aclose()
