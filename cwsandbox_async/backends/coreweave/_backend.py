"""CoreWeaveBackend: sandboxes on the CoreWeave Sandbox service, asyncio-native over its gRPC protocol."""

from __future__ import annotations

import builtins
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from ..._errors import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxError,
    SandboxFileError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxValidationError,
)
from ..._log import log
from ..._types import ExecExit, ExecRequest, SandboxInfo, SandboxSpec, SandboxStatus, StreamName
from ..._validate import validate_sweep, validate_timeout
from .._shared import DestroyedIds, destroy_each, sweep_victims
from ..base import Backend, OutputCallback
from . import _files
from ._channel import Channel, RpcError, open_channel
from ._convert import MANAGED_TAG, create_request, driver_tag, id_tag, sandbox_info, status_of
from ._diagnose import diagnose
from ._errors import translate
from ._exec import ExecOutcome, run_stream, run_unary, wrap
from ._options import CoreWeaveOptions, unenforced_limits
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
    exec; ``pids`` and ``tmp_mib`` are not enforced (one WARNING per backend when set).
    ``max_lifetime_seconds`` is the service's TTL, set at create only (see ``set_lifetime``);
    tags are the service's tags (plus ``scope_tags``), ``network=False`` denies egress and ingress.
    Created with an idempotency key (``request_id``), so a retried create never makes two.
    Ready when RUNNING, found by one ``ListSandboxes`` per ``ready_poll_seconds`` for all
    sandboxes starting at once.

    Exec: see ``_exec`` (unary ``Exec`` unless stdin or streaming needs ``StreamExec``, and
    ``StreamExec`` for good once the service answers ``UNIMPLEMENTED`` to ``Exec``, as it may:
    the SDK never calls it; a first burst of execs asks once; ``exec_rpc="stream"`` never tries
    unary). Files:
    ``ReadFile``/``WriteFile``. ``sweep`` and closing use ``PurgeSandboxes`` (one call) where
    the service offers it, else one delete per sandbox.

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
        self.scope = self.options.scope()
        self.driver_id = uuid.uuid4().hex[:12]
        self._channel: Channel | None = None
        self._readiness: Readiness | None = None
        self._ids: dict[str, str] = {}  # library id -> service id
        self._limits: dict[str, tuple[int | None, int | None]] = {}  # cpu_seconds, file_size_mib
        self._destroyed = DestroyedIds()  # status says COMPLETED; a create that lands late is deleted
        self._created_any = False
        self._closed = False
        self._opening = anyio.Lock()
        self._ends: dict[str, float | None] = {}  # library id -> when its lifetime ends (monotonic)
        self._warned_unenforced = False

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
    async def _ensure(self) -> Channel:
        if self._closed:
            raise SandboxBackendUnavailableError("the coreweave backend is closed", infrastructure=False)
        if self._channel is None:
            endpoint = self.options.endpoint()
            metadata = self.options.auth_metadata(endpoint)
            async with self._opening:  # one channel, however many calls arrive first
                if self._channel is None:
                    channel = await open_channel(self.options, endpoint, metadata)
                    if self._closed:
                        await channel.aclose()
                        raise SandboxBackendUnavailableError("the coreweave backend is closed", infrastructure=False)
                    self._channel = channel
            if self._readiness is None:
                self._readiness = Readiness(self._list_own, self.options.ready_poll_seconds, self._starting)
                log.debug("coreweave backend connected", target=endpoint.target, secure=endpoint.secure)
        assert self._channel is not None
        return self._channel

    @staticmethod
    def _starting(sandbox: Any) -> bool:
        return status_of(sandbox.status.state) is SandboxStatus.CREATING

    async def _pages(self, tags: Sequence[str], *, show_terminated: bool = False) -> builtins.list[Any]:
        from cwsandbox._proto import sandbox_pb2 as pb

        channel, found, token = await self._ensure(), [], ""
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
        channel = await self._ensure()
        request = create_request(spec, self.options, self.driver_id, self.scope)
        res = spec.defaults.resources
        self._limits[sid] = (res.cpu_seconds, res.file_size_mib)
        self._created_any = True
        unenforced = unenforced_limits(res)
        if unenforced and not self._warned_unenforced:
            self._warned_unenforced = True  # once per backend: the service has no such limits
            log.warning("coreweave does not enforce these Resources limits (set them to None)", **unenforced)
        started = time.monotonic()  # no later than the service's clock starts the lifetime
        try:
            sandbox = await channel.unary("CreateSandbox", request)  # idempotent: one request_id for every retry
        except RpcError as exc:
            raise translate(exc.failure, "create sandbox", sandbox_id=sid) from exc
        service_id = sandbox.sandbox_id
        self._ids[sid] = service_id
        ttl = sandbox.status.effective_max_lifetime_seconds or request.sandbox.spec.max_lifetime_seconds
        self._ends[sid] = started + ttl if ttl else None
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
    def _unary_wanted(self, request: ExecRequest, on_output: OutputCallback | None) -> bool:
        """Whether this exec would take unary ``Exec`` where the service serves it (see ``_exec``)."""
        rpc = self.options.exec_rpc
        return rpc == "unary" or (rpc == "auto" and not (request.stdin or on_output))

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        service_id = self._ids.get(sandbox_id)  # the common case without a coroutine per lookup
        if service_id is None or sandbox_id in self._destroyed:
            service_id = await self._usable(sandbox_id)
        channel = self._channel
        if channel is None or self._closed:
            channel = await self._ensure()
        start = time.monotonic()
        out, streamed = await self._run(
            channel, service_id, request, lambda s: self._argv(sandbox_id, request, s), on_output
        )
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

    async def _run(
        self,
        channel: Channel,
        service_id: str,
        request: ExecRequest,
        argv_for: Callable[[bool], list[str]],
        on_output: OutputCallback | None,
    ) -> tuple[ExecOutcome, bool]:
        """Run ``request`` on unary ``Exec`` where it is wanted and the service serves it (or, not known
        yet, as the channel's one probe: execs meanwhile take ``StreamExec``), else on ``StreamExec``
        (``argv_for(streamed)`` is the argv); whether it streamed. ``Exec`` answered ``UNIMPLEMENTED``
        (so nothing ran): the same command once more over ``StreamExec``, and ``StreamExec`` for every
        later exec on this channel."""
        if self._unary_wanted(request, on_output) and channel.probe_unary_exec():
            served: bool | None = None
            try:
                out = await run_unary(channel, service_id, request, argv_for(False), self.options.exec_slack_seconds)
                if out.error is None:
                    served = True
                elif out.error.failure.code.name == "UNIMPLEMENTED":
                    served = False
            finally:
                channel.unary_exec_seen(served)  # also when cancelled: the next exec asks again
            if served is not False:
                return out, False
        return await self._stream_with_retries(channel, service_id, request, argv_for(True), on_output), True

    def _argv(self, sandbox_id: str, request: ExecRequest, streamed: bool) -> list[str]:
        cpu, fsize = self._limits.get(sandbox_id, (None, None))
        kill_after = self.options.kill_after_seconds
        return wrap(request, kill_after, cpu_seconds=cpu, file_size_mib=fsize, cap_inside=not streamed)

    async def _diagnose(
        self, sandbox_id: str, service_id: str, request: ExecRequest, out: ExecOutcome, wall: float
    ) -> ExecExit:
        destroyed = sandbox_id in self._destroyed
        channel = await self._ensure()

        async def probe() -> ExecOutcome:
            """``true`` in the same sandbox, on the RPC this backend uses (with its fallback), under the
            request deadline."""
            check = ExecRequest(("true",), "/", {}, None, self.options.request_timeout_seconds, 1024)
            checked, _ = await self._run(channel, service_id, check, lambda _: ["true"], None)
            return checked

        return await diagnose(channel, sandbox_id, service_id, request, out, wall, destroyed=destroyed, probe=probe)

    async def _stream_with_retries(
        self, channel: Channel, service_id: str, request: ExecRequest, argv: Sequence[str], on_output: Any
    ) -> ExecOutcome:
        """A stream the service refused before any frame (so before the command ran) is sent again."""

        slack = self.options.exec_slack_seconds

        def refused(out: ExecOutcome) -> bool:
            return out.error is not None and not out.started and out.error.failure.refused_before_start

        first: ExecOutcome | None = await run_stream(channel, service_id, request, argv, slack, on_output)
        assert first is not None
        if not refused(first) or self.options.max_retries == 0:
            return first  # the common case, without building a retry loop (tenacity costs a third of an exec)

        async def attempt() -> ExecOutcome:
            nonlocal first
            out, first = (first, None) if first is not None else (None, None)
            if out is None:
                out = await run_stream(channel, service_id, request, argv, slack, on_output)
            if refused(out):
                assert out.error is not None
                raise out.error  # attempt 1 already failed: tenacity counts it and waits
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
            data = await _files.read(await self._ensure(), service_id, path, self.options.file_timeout_seconds)
        except RpcError as exc:
            raise translate(exc.failure, f"read {path}", sandbox_id=sandbox_id, path=path) from exc.cause
        if len(data) > max_bytes:
            raise _files.too_large(sandbox_id, path, len(data), max_bytes)
        return data

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        service_id = await self._usable(sandbox_id)
        channel, seconds = await self._ensure(), self.options.file_timeout_seconds
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
            await (await self._ensure()).unary("DeleteSandbox", req)
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
        self._ends.pop(sandbox_id, None)

    async def status(self, sandbox_id: str) -> SandboxStatus:
        from cwsandbox._proto import sandbox_pb2 as pb

        if sandbox_id in self._destroyed:
            return SandboxStatus.COMPLETED
        service_id = await self._service_id(sandbox_id)
        if service_id is None:
            return SandboxStatus.COMPLETED
        try:
            sandbox = await (await self._ensure()).unary("GetSandbox", pb.GetSandboxRequest(sandbox_id=service_id))
        except RpcError as exc:
            if exc.failure.code.name == "NOT_FOUND":
                return SandboxStatus.COMPLETED
            raise translate(exc.failure, "get sandbox", sandbox_id=sandbox_id) from exc.cause
        return status_of(sandbox.status.state)

    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        try:
            found = await self._pages([MANAGED_TAG, *self.scope, *tags])
        except RpcError as exc:
            raise translate(exc.failure, "list sandboxes") from exc.cause
        infos = []
        for sb in found:
            info = sandbox_info(sb, self.name, self.scope)
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
        if exact and channel is not None and await purge(channel, [MANAGED_TAG, *self.scope, *wanted]):
            for sid in victims:
                self._destroyed.add(sid)
                self._ids.pop(sid, None)
                self._limits.pop(sid, None)
                self._ends.pop(sid, None)
            log.info("coreweave sweep", tags=list(wanted), swept=len(victims), purged=True)
            return victims
        swept = await destroy_each(victims, self.destroy, "coreweave")
        log.info("coreweave sweep", tags=list(wanted), swept=len(swept))
        return swept

    async def set_lifetime(self, sandbox_id: str, seconds: float | None) -> None:
        """The service sets a sandbox's lifetime only when it creates it (``max_lifetime_seconds``; the
        protocol has no call to change it), so this cannot move an end. It succeeds when the lifetime
        set at create already ends the sandbox within ``seconds`` from now (the bound the caller asks
        for holds), and ``None`` is a no-op; otherwise it raises ``SandboxValidationError`` saying so
        (a ``SandboxPool`` then does not hand the sandbox out). A pool whose leases have a hold timeout
        sets the lifetime at create instead: ``SandboxDefaults(max_lifetime_seconds=...)`` no longer than
        ``hold_timeout_seconds + lifetime_margin_seconds``. A destroyed sandbox raises
        ``SandboxTerminatedError``."""
        if seconds is None:
            return
        validate_timeout(seconds, "seconds")
        if sandbox_id in self._destroyed:
            raise SandboxTerminatedError(f"sandbox {sandbox_id} was destroyed", sandbox_id=sandbox_id)
        end = self._ends.get(sandbox_id)
        now = time.monotonic()
        if end is not None and end <= now + seconds:
            return
        has = "no lifetime" if end is None else f"a lifetime that ends in {end - now:.0f} s"
        raise SandboxValidationError(
            f"cannot end sandbox {sandbox_id} in {seconds:g} s: the CoreWeave service sets a lifetime only when it "
            f"creates a sandbox, and this one has {has}; for a pool with hold_timeout_seconds, create its "
            "sandboxes with SandboxDefaults(max_lifetime_seconds=...) no longer than the hold timeout plus "
            "lifetime_margin_seconds",
            sandbox_id=sandbox_id,
        )

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
