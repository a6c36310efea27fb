"""KubernetesBackend: one pod per sandbox, exec over WebSocket, readiness from one shared watch."""

from __future__ import annotations

import asyncio
import builtins
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import anyio

from ..._errors import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxTransportError,
    SandboxValidationError,
)
from ..._log import log
from ..._types import ExecExit, ExecRequest, SandboxInfo, SandboxSpec, SandboxStatus
from ..._validate import validate_tags, validate_timeout
from ..base import Backend, OutputCallback
from ._auth import parse_rfc3339
from ._client import KubeApiError, KubeClient
from ._config import load_config
from ._exec import KILL_AFTER_SECONDS, ExecStatusError, StreamResult, exit_code, stream_exec, wrap_command
from ._files import read_argv, read_result, write_argv, write_result
from ._inventory import list_pods, pods_path, sandbox_info
from ._manifest import (
    DRIVER_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    build_pod,
    selector,
    tag_selector,
)
from ._options import KubernetesOptions
from ._podstate import MAIN_CONTAINER, PodView, view
from ._watch import PodWatch

__all__ = ["KubernetesBackend"]

#: Seconds past an exec's own timeout before the client gives up on the stream.
EXEC_SLACK_SECONDS = KILL_AFTER_SECONDS + 3.0
#: Destroyed ids remembered (so status says COMPLETED and late creations are reaped).
MAX_REMEMBERED = 100_000


class KubernetesBackend(Backend):
    """Sandboxes as pods on a Kubernetes cluster. Load it by name:
    ``Session(backend="kubernetes", backend_options={...})``; options are ``KubernetesOptions`` fields.

    Connection: ``kubeconfig``/``context`` (default ``$KUBECONFIG`` or ``~/.kube/config``), or
    ``in_cluster=True`` (the pod's service account; chosen automatically when no kubeconfig
    exists and ``KUBERNETES_SERVICE_HOST`` is set), or an explicit ``server`` with
    ``token``/``token_file``/``client_cert_file``+``client_key_file``/``ca_file``.
    ``namespace`` defaults to the context's (or ``default``).

    Pod: ``image`` (used when ``SandboxDefaults.image`` is None), ``runtime_class_name``
    (gVisor, Kata), ``node_selector``, ``tolerations``, ``image_pull_secrets``,
    ``image_pull_policy``, ``labels``, ``annotations``, ``run_as_user``/``run_as_group``
    (non-root, 65532), ``host_users``, ``read_only_root_filesystem``. ``Resources.cpu`` and
    ``memory_mib`` become limits (and equal requests), ``tmp_mib``/``workspace_mib`` the
    emptyDir size limits, ``cpu_seconds`` an in-container ``ulimit -t``; ``pids`` and
    ``file_size_mib`` are not enforced per pod (use the kubelet's ``podPidsLimit``).
    ``max_lifetime_seconds`` is the pod's ``activeDeadlineSeconds``. ``network=False`` only
    labels the pod ``cwsandbox.io/network=none``: a NetworkPolicy selecting that label
    (see the README) does the blocking.

    API etiquette: ``qps``/``burst`` token bucket and ``max_in_flight`` for every request
    (exec upgrades included), retries (``max_retries``) honouring ``Retry-After``,
    ``request_timeout_seconds`` per attempt.

    Failures: a pod that cannot start raises ``SandboxCreationError`` with ``reason`` set to
    the Kubernetes reason (``ImagePullBackOff``, ``Unschedulable``, ``OOMKilled``,
    ``Forbidden``...); a pod that died raises ``SandboxNotRunningError``; a broken stream
    ``SandboxTransportError``; an unreachable or unauthorised API server
    ``SandboxBackendUnavailableError``.
    """

    name = "kubernetes"

    def __init__(self, **options: Any) -> None:
        self.options = KubernetesOptions.from_kwargs(options)
        self.driver_id = uuid.uuid4().hex[:12]
        self._client: KubeClient | None = None
        self._watch: PodWatch | None = None
        self._namespace: str | None = None
        self._lock: anyio.Lock | None = None
        self._destroyed: OrderedDict[str, None] = OrderedDict()
        self._cpu_seconds: dict[str, int | None] = {}
        self._reapers: set[asyncio.Task[None]] = set()
        self._created_any = False
        self._closed = False

    @property
    def isolation(self) -> str:
        rc = self.options.runtime_class_name
        return f"pod (runtimeClassName={rc})" if rc else "pod"

    @property
    def namespace(self) -> str | None:
        """The namespace in use (known after the first call)."""
        return self._namespace

    @property
    def client(self) -> KubeClient | None:
        """The API client (None before the first call); ``client.calls`` counts requests by verb."""
        return self._client

    @property
    def watch(self) -> PodWatch | None:
        return self._watch

    # -- plumbing --------------------------------------------------------------
    async def _ensure(self) -> tuple[KubeClient, str]:
        if self._closed:
            raise SandboxBackendUnavailableError("the kubernetes backend is closed")
        if self._client is None:
            if self._lock is None:
                self._lock = anyio.Lock()
            async with self._lock:
                if self._client is None:
                    cfg = await anyio.to_thread.run_sync(load_config, self.options)
                    self._namespace = cfg.namespace
                    self._client = KubeClient(cfg, self.options)
                    log.debug("k8s backend configured", source=cfg.source, namespace=cfg.namespace)
        assert self._namespace is not None
        return self._client, self._namespace

    async def _ensure_watch(self) -> PodWatch:
        client, ns = await self._ensure()
        if self._watch is None:
            sel = selector(f"{MANAGED_BY_LABEL}={MANAGED_BY}", f"{DRIVER_LABEL}={self.driver_id}")
            self._watch = PodWatch(
                client, ns, sel, watch_timeout=self.options.watch_timeout_seconds, on_change=self._on_change
            )
            self._watch.start()
        return self._watch

    def _pod_path(self, ns: str, name: str) -> str:
        return f"{pods_path(ns)}/{quote(name, safe='')}"

    def _remember_destroyed(self, sandbox_id: str) -> None:
        self._destroyed[sandbox_id] = None
        self._destroyed.move_to_end(sandbox_id)
        while len(self._destroyed) > MAX_REMEMBERED:
            self._destroyed.popitem(last=False)

    def _on_change(self, name: str, pod: dict[str, Any] | None) -> None:
        """Reap a pod that appears after we destroyed it (a create that raced its own cancellation)."""
        if pod is None or name not in self._destroyed or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return
        task = asyncio.get_running_loop().create_task(self._reap(name))
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def _reap(self, name: str) -> None:
        try:
            await self._delete(name)
            log.info("k8s reaped a pod created after its sandbox was destroyed", sandbox_id=name)
        except SandboxError as exc:
            log.warning("k8s reaping failed", sandbox_id=name, error=repr(exc))

    async def _delete(self, name: str) -> None:
        client, ns = await self._ensure()
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": self.options.termination_grace_seconds,
            "propagationPolicy": "Background",
        }
        try:
            await client.request("DELETE", self._pod_path(ns, name), body=body, what=f"delete pod {name}")
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    async def _pod_view(self, name: str) -> PodView:
        watch = self._watch
        if watch is not None:
            return await watch.refresh(name)
        client, ns = await self._ensure()
        try:
            return view(name, await client.request("GET", self._pod_path(ns, name), what=f"get pod {name}"))
        except KubeApiError as exc:
            if exc.status == 404:
                return view(name, None)
            raise

    # -- create ----------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> None:
        sid = spec.sandbox_id
        client, ns = await self._ensure()
        manifest = build_pod(spec, self.options, namespace=ns, driver=self.driver_id)
        watch = await self._ensure_watch()
        self._cpu_seconds[sid] = spec.defaults.resources.cpu_seconds
        self._created_any = True
        try:
            pod = await client.request(
                "POST", pods_path(ns), body=manifest, what=f"create pod {sid}", forbidden_is_unavailable=False
            )
        except KubeApiError as exc:
            pod = await self._create_failed(sid, exc)
        watch.observe(sid, pod, fresh=False)
        budget = spec.defaults.create_timeout_seconds
        await watch.wait_ready(
            sid,
            within=budget - min(1.0, 0.05 * budget),
            unschedulable_grace=self.options.unschedulable_grace_seconds,
        )
        log.debug("k8s pod ready", sandbox_id=sid)

    async def _create_failed(self, sid: str, exc: KubeApiError) -> dict[str, Any]:
        if exc.status == 409:  # a retried POST whose first attempt landed: ours if it carries our driver label
            client, ns = await self._ensure()
            pod = await client.request("GET", self._pod_path(ns, sid), what=f"get pod {sid}")
            if ((pod.get("metadata") or {}).get("labels") or {}).get(DRIVER_LABEL) == self.driver_id:
                return pod
            raise SandboxCreationError(
                f"a pod named {sid} already exists", sandbox_id=sid, reason="AlreadyExists"
            ) from exc
        if exc.status in (400, 403, 422):
            raise SandboxCreationError(
                f"the API server rejected pod {sid}: {exc.message}",
                sandbox_id=sid,
                reason=exc.reason or str(exc.status),
            ) from exc
        raise exc

    # -- exec ------------------------------------------------------------------
    def _check_usable(self, sandbox_id: str) -> None:
        if sandbox_id in self._destroyed:
            raise SandboxTerminatedError(f"sandbox {sandbox_id} was destroyed", sandbox_id=sandbox_id)
        cached = self._watch.view(sandbox_id) if self._watch is not None else None
        if cached is not None and cached.dead:
            raise cached.not_running_error()

    async def _stream(self, sandbox_id: str, argv: Sequence[str], **kw: Any) -> StreamResult:
        client, ns = await self._ensure()
        self._check_usable(sandbox_id)
        try:
            return await stream_exec(
                client,
                ns,
                sandbox_id,
                argv,
                container=MAIN_CONTAINER,
                connect_timeout=2 * self.options.request_timeout_seconds,
                **kw,
            )
        except KubeApiError as exc:
            raise await self._diagnose(sandbox_id, exc) from exc

    async def _diagnose(self, sandbox_id: str, exc: SandboxTransportError) -> SandboxError:
        """Turn a failed exec into the most specific error: a dead pod beats a broken socket."""
        status = getattr(exc, "status", None)
        if status == 403:
            return SandboxBackendUnavailableError(
                f"exec into {sandbox_id} forbidden: grant get and create on pods/exec ({exc.message})",
                sandbox_id=sandbox_id,
            )
        try:
            with anyio.fail_after(self.options.request_timeout_seconds):
                pod = await self._pod_view(sandbox_id)
        except (SandboxError, TimeoutError):
            return exc
        if pod.dead:
            return pod.not_running_error()
        exc.sandbox_id = sandbox_id
        return exc

    async def _exit_code(self, sandbox_id: str, res: StreamResult) -> int:
        if res.status is None:
            raise await self._diagnose(
                sandbox_id,
                SandboxTransportError(
                    f"exec stream to {sandbox_id} closed without an exit status ({res.protocol})", sandbox_id=sandbox_id
                ),
            )
        try:
            return exit_code(res.status, sandbox_id)
        except ExecStatusError as exc:
            raise await self._diagnose(sandbox_id, exc) from exc

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        stdin = request.stdin or b""
        argv = wrap_command(
            request.argv,
            cwd=request.cwd,
            env=request.env,
            timeout=request.timeout_seconds,
            cpu_seconds=self._cpu_seconds.get(sandbox_id),
            stdin_len=len(stdin),
        )

        async def on_chunk(channel: int, data: bytes) -> None:
            assert on_output is not None
            await on_output("stdout" if channel == 1 else "stderr", data)

        res = await self._stream(
            sandbox_id,
            argv,
            stdin=stdin,
            deadline_seconds=request.timeout_seconds + EXEC_SLACK_SECONDS,
            max_stdout=request.max_output_bytes,
            max_stderr=request.max_output_bytes,
            on_chunk=on_chunk if on_output is not None else None,
        )
        if res.truncated or res.deadline_hit:
            return ExecExit(-9, res.stdout, res.stderr, res.wall_seconds, 0.0, res.deadline_hit, res.truncated)
        rc = await self._exit_code(sandbox_id, res)
        timed_out = rc in (124, 128 + 9) and res.wall_seconds >= request.timeout_seconds
        if timed_out:
            rc = -15 if rc == 124 else -9
        return ExecExit(rc, res.stdout, res.stderr, res.wall_seconds, 0.0, timed_out, False)

    # -- files -----------------------------------------------------------------
    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        res = await self._stream(
            sandbox_id,
            read_argv(path, max_bytes),
            stdin=None,
            deadline_seconds=self.options.file_timeout_seconds,
            max_stdout=max_bytes + 1,
            max_stderr=64 * 1024,
        )
        if res.deadline_hit:
            raise SandboxTransportError(f"read of {path} did not finish in time", sandbox_id=sandbox_id)
        rc = 0 if res.truncated else await self._exit_code(sandbox_id, res)
        return read_result(sandbox_id, path, max_bytes, rc, res.stdout, res.stderr, res.truncated)

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        res = await self._stream(
            sandbox_id,
            write_argv(path, len(data)),
            stdin=data,
            deadline_seconds=self.options.file_timeout_seconds,
            max_stdout=1024,
            max_stderr=64 * 1024,
        )
        if res.deadline_hit or res.truncated:
            raise SandboxTransportError(f"write of {path} did not finish cleanly", sandbox_id=sandbox_id)
        rc = await self._exit_code(sandbox_id, res)
        write_result(sandbox_id, path, len(data), rc, res.stdout, res.stderr)

    # -- destroy, status, list ---------------------------------------------------
    async def destroy(self, sandbox_id: str) -> None:
        self._remember_destroyed(sandbox_id)  # first: a create still in flight is reaped when it lands
        try:
            await self._delete(sandbox_id)
        except SandboxError:
            self._destroyed.pop(sandbox_id, None)  # still there: list and sweep must see it
            raise
        self._cpu_seconds.pop(sandbox_id, None)

    async def status(self, sandbox_id: str) -> SandboxStatus:
        if sandbox_id in self._destroyed:
            return SandboxStatus.COMPLETED
        watch = self._watch
        cached = watch.view(sandbox_id) if watch is not None and watch.healthy else None
        if cached is not None:
            return cached.status
        return (await self._pod_view(sandbox_id)).status

    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        client, ns = await self._ensure()
        pods, _ = await list_pods(client, ns, selector(f"{MANAGED_BY_LABEL}={MANAGED_BY}", *tag_selector(tags)))
        return [sandbox_info(p, self.name) for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]

    # -- extras ----------------------------------------------------------------
    async def sweep(
        self, tags: Sequence[str] = (), *, older_than_seconds: float | None = None, include_own: bool = False
    ) -> builtins.list[str]:
        """Delete this library's pods carrying all of ``tags`` (leftovers of crashed drivers), optionally only
        those older than ``older_than_seconds``; this backend's own pods only with ``include_own``.
        One ``deletecollection`` call when no age is given. Returns the names deleted."""
        wanted = validate_tags(tags)
        min_age = validate_timeout(older_than_seconds, "older_than_seconds", allow_none=True)
        if not wanted and min_age is None:
            raise SandboxValidationError("sweep needs tags or older_than_seconds, so it cannot delete everything")
        parts = [f"{MANAGED_BY_LABEL}={MANAGED_BY}", *tag_selector(wanted)]
        if not include_own:
            parts.append(f"{DRIVER_LABEL}!={self.driver_id}")
        sel = selector(*parts)
        client, ns = await self._ensure()
        if min_age is None:
            doc = await client.request("DELETE", pods_path(ns), params=[("labelSelector", sel)], what="sweep pods")
            names = [i["metadata"]["name"] for i in doc.get("items") or [] if isinstance(i, dict)]
        else:
            now = time.time()
            names = [i.sandbox_id for i in await self.list(wanted) if now - i.created_at >= min_age]
            names = [n for n in names if include_own or n not in self._cpu_seconds]
            failed: list[str] = []

            async def delete(name: str) -> None:
                try:
                    await self._delete(name)
                except SandboxError as exc:
                    failed.append(name)
                    log.warning("k8s sweep could not delete a pod", sandbox_id=name, error=repr(exc))

            async with anyio.create_task_group() as tg:
                for n in names:
                    tg.start_soon(delete, n)
            names = [n for n in names if n not in failed]
        log.info("k8s sweep", tags=list(wanted), swept=len(names))
        return names

    async def set_lifetime(self, sandbox_id: str, seconds: float | None) -> None:
        """Make the pod's hard TTL end ``seconds`` from now (PATCH ``activeDeadlineSeconds``; a pooled pod's TTL
        starts at lease). Kubernetes only lets a deadline shrink: a later end raises ``SandboxValidationError``.
        ``None`` keeps the TTL the pod has."""
        if seconds is None:
            return
        validate_timeout(seconds, "seconds")
        client, ns = await self._ensure()
        pod = await client.request("GET", self._pod_path(ns, sandbox_id), what=f"get pod {sandbox_id}")
        started = (pod.get("status") or {}).get("startTime")
        elapsed = time.time() - parse_rfc3339(started) if started else 0.0
        body = {"spec": {"activeDeadlineSeconds": max(1, math.ceil(elapsed + seconds))}}
        try:
            await client.request(
                "PATCH",
                self._pod_path(ns, sandbox_id),
                body=body,
                content_type="application/merge-patch+json",
                what=f"set lifetime of {sandbox_id}",
            )
        except KubeApiError as exc:
            if exc.status == 422:
                raise SandboxValidationError(
                    f"cannot extend the lifetime of {sandbox_id}: {exc.message}", sandbox_id=sandbox_id
                ) from exc
            if exc.status == 404:
                raise SandboxNotRunningError(f"pod {sandbox_id} no longer exists", sandbox_id=sandbox_id) from exc
            raise

    async def aclose(self) -> None:
        """Stop the watch, delete any pod of this backend still alive (``sweep_on_close``), close connections."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(30):
            if self._watch is not None:
                await self._watch.aclose()
            reapers = list(self._reapers)
            for task in reapers:
                task.cancel()
            if reapers:
                await asyncio.gather(*reapers, return_exceptions=True)
            client, ns = self._client, self._namespace
            if client is not None and ns is not None and self._created_any and self.options.sweep_on_close:
                sel = selector(f"{MANAGED_BY_LABEL}={MANAGED_BY}", f"{DRIVER_LABEL}={self.driver_id}")
                try:
                    with anyio.fail_after(10):
                        await client.request("DELETE", pods_path(ns), params=[("labelSelector", sel)], what="close")
                except (SandboxError, TimeoutError) as exc:
                    log.warning("k8s final sweep failed", error=repr(exc))
            if client is not None:
                await client.aclose()
