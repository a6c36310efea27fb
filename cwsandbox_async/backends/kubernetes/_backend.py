"""KubernetesBackend: one pod per sandbox, exec over WebSocket, readiness from one shared watch."""

from __future__ import annotations

import builtins
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import quote

import anyio

from ..._errors import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxError,
    SandboxTerminatedError,
)
from ..._log import log
from ..._tasks import HostedTaskGroup
from ..._types import ExecExit, ExecRequest, SandboxInfo, SandboxSpec, SandboxStatus
from ..._validate import validate_sweep, validate_timeout
from .._shared import DestroyedIds, destroy_each, sweep_victims
from ..base import Backend, OutputCallback
from ._admission import create_pod, refusal
from ._cleanup import Cleanup
from ._client import KubeApiError, KubeClient
from ._connect import connect
from ._inventory import list_pods, pods_path, sandbox_info
from ._lifetime import set_lifetime
from ._manifest import (
    DRIVER_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    build_pod,
    selector,
    tag_selector,
)
from ._options import KubernetesOptions
from ._podstate import PodView, view
from ._runner import PodRunner
from ._watch import PodWatch

__all__ = ["KubernetesBackend"]


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
    ``max_lifetime_seconds`` is the pod's ``activeDeadlineSeconds`` (``default_lifetime_seconds``,
    6 h, when it is None: every pod ends by itself). ``network=False`` only
    labels the pod ``cwsandbox.io/network=none``: a NetworkPolicy selecting that label
    (see the README) does the blocking.

    API etiquette: ``qps``/``burst`` token bucket and ``max_in_flight`` for every request
    (exec upgrades included), retries (``max_retries``) honouring ``Retry-After``,
    ``request_timeout_seconds`` per attempt.

    Execs: each command runs in a session of its own; an exec the backend abandons
    (cancelled, timed out, cut at the output cap, a broken stream) has its session killed by
    a follow-up exec in the background (a closed exec socket does not stop a command on a
    real cluster), and the next call on that sandbox waits for it. ``ExecRequest.exclusive``
    kills every other process in the pod first; ``ExecRequest.cpu_seconds`` and
    ``Resources.cpu_seconds`` become ``ulimit -t`` (``cpu_exceeded`` on SIGXCPU).

    Failures: a pod that cannot start raises ``SandboxCreationError`` with ``reason`` set to
    the Kubernetes reason (``ImagePullBackOff``, ``Unschedulable``, ``OOMKilled``...). Creates
    and patches send ``fieldValidation=Strict``: a misspelled field (in ``tolerations``, say)
    raises ``SandboxValidationError``; the server's ``Warning`` headers are logged (WARNING,
    once per text). A create refused by RBAC, ResourceQuota, LimitRange or Pod Security is
    the caller's (``reason`` ``RBAC``, ``ExceededQuota``, ``LimitRange``, ``PodSecurity``,
    ``Forbidden``); the 403 of a namespace whose ``default`` ServiceAccount does not exist
    yet is retried until the create deadline (``_admission``). A pod that dies during an exec
    (reported by the exec as exit 137, a hang, or no status) is looked up: a container
    ``OOMKilled`` by the program's memory is the program's result (``ExecExit.oom_killed``); any other death raises
    ``SandboxNotRunningError``, with ``infrastructure`` False when the program or the caller
    caused it (storage limits, the pod's own deadline) and True otherwise. A broken stream
    raises ``SandboxTransportError``; an unreachable or unauthorised API server
    ``SandboxBackendUnavailableError``. An unexpected exception is a bug and propagates.
    """

    name = "kubernetes"

    def __init__(self, **options: Any) -> None:
        self.options = KubernetesOptions.from_kwargs(options)
        self.driver_id = uuid.uuid4().hex[:12]
        self._client: KubeClient | None = None
        self._watch: PodWatch | None = None
        self._namespace: str | None = None
        self._lock: anyio.Lock | None = None
        self._destroyed = DestroyedIds()  # so status says COMPLETED and late creations are reaped
        self._reaped = DestroyedIds()  # late pods whose reaping DELETE went through
        self._deleting: set[str] = set()  # destroys whose own DELETE is in flight
        self._cpu_seconds: dict[str, int | None] = {}
        self._tasks = HostedTaskGroup("cwsandbox-k8s-background")  # the watch and the cleanups run in it
        self._cleanup: Cleanup | None = None
        self._runner: PodRunner | None = None
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
            raise SandboxBackendUnavailableError(
                "the kubernetes backend is closed", infrastructure=False
            )  # the caller's
        if self._client is None:
            if self._lock is None:
                self._lock = anyio.Lock()
            async with self._lock:
                if self._client is None:
                    conn = await connect(self.options)
                    self._namespace = conn.namespace
                    self._cleanup = Cleanup(await self._tasks.open())
                    self._runner = PodRunner(self.options, self._ensure, self, self._cleanup)
                    self._client = KubeClient(conn, self.options)
                    log.debug("k8s backend configured", source=conn.source, namespace=conn.namespace)
        assert self._namespace is not None
        return self._client, self._namespace

    async def _ensure_watch(self) -> PodWatch:
        client, ns = await self._ensure()
        if self._watch is None:
            sel = selector(f"{MANAGED_BY_LABEL}={MANAGED_BY}", f"{DRIVER_LABEL}={self.driver_id}")
            o = self.options
            self._watch = PodWatch(
                client,
                ns,
                sel,
                watch_timeout=o.watch_timeout_seconds,
                stale=o.watch_stale_seconds,
                down_poll=o.watch_down_poll_seconds,
                max_backoff=o.max_backoff_seconds,
                on_change=self._on_change,
            )
            self._watch.start(await self._tasks.open())
        return self._watch

    def _pod_path(self, ns: str, name: str) -> str:
        return f"{pods_path(ns)}/{quote(name, safe='')}"

    def _on_change(self, name: str, pod: dict[str, Any] | None) -> None:
        """Reap a pod that appears after we destroyed it (a create that raced its own cancellation)."""
        if pod is None or name not in self._destroyed or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return
        if name in self._deleting:  # an event sent before our own DELETE: that DELETE decides
            return
        if self._cleanup is None or self._cleanup.pending(f"reap:{name}") or name in self._reaped:
            # one DELETE per pod: events sent before it took effect (they may arrive after it) add none
            return

        async def reap() -> None:
            await self._delete(name)
            self._reaped.add(name)
            log.info("k8s reaped a pod created after its sandbox was destroyed", sandbox_id=name)

        self._cleanup.spawn(f"reap:{name}", "reap", reap, within=self.options.kill_timeout_seconds)

    # -- what the runner asks about pods (``_runner.Pods``) ----------------------
    def destroyed(self, sandbox_id: str) -> bool:
        return sandbox_id in self._destroyed

    def cached(self, sandbox_id: str) -> PodView | None:
        return self._watch.view(sandbox_id) if self._watch is not None else None

    async def fetch(self, sandbox_id: str) -> PodView:
        return await self._pod_view(sandbox_id)

    def dead_waiter(self, sandbox_id: str) -> Callable[[], Awaitable[PodView]] | None:
        watch = self._watch
        if watch is None:
            return None

        async def wait() -> PodView:
            return await watch.wait_dead(sandbox_id)

        return wait

    def cpu_seconds(self, sandbox_id: str) -> int | None:
        return self._cpu_seconds.get(sandbox_id)

    async def _delete(self, name: str) -> bool:
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
            return False
        return True

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
        budget = spec.defaults.create_timeout_seconds
        deadline = time.monotonic() + budget - min(1.0, 0.05 * budget)
        client, ns = await self._ensure()
        manifest = build_pod(spec, self.options, namespace=ns, driver=self.driver_id)
        watch = await self._ensure_watch()
        self._cpu_seconds[sid] = spec.defaults.resources.cpu_seconds
        self._created_any = True
        try:
            pod = await create_pod(client, pods_path(ns), manifest, sid, deadline=deadline)
        except KubeApiError as exc:
            pod = await self._create_failed(sid, exc)
        watch.observe(sid, pod, fresh=False)
        await watch.wait_ready(
            sid,
            within=max(0.0, deadline - time.monotonic()),
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
            raise refusal(sid, exc) from exc
        raise exc

    # -- exec and files (``_runner``) ---------------------------------------------
    async def _runner_for(self) -> PodRunner:
        await self._ensure()
        assert self._runner is not None
        return self._runner

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        return await (await self._runner_for()).exec(sandbox_id, request, on_output)

    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        return await (await self._runner_for()).read_file(sandbox_id, path, max_bytes)

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        await (await self._runner_for()).write_file(sandbox_id, path, data)

    # -- destroy, status, list ---------------------------------------------------
    async def destroy(self, sandbox_id: str) -> None:
        with self._destroyed.destroying(sandbox_id):  # a create still in flight is reaped when it lands
            if self._cleanup is not None:
                self._cleanup.forget(sandbox_id)  # killing its commands is moot: the pod goes
            self._deleting.add(sandbox_id)
            try:
                deleted = await self._delete(sandbox_id)
            finally:
                self._deleting.discard(sandbox_id)
        if deleted:  # it took effect: later events for this pod are stale ones, nothing to reap
            self._reaped.add(sandbox_id)
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

    # -- sweep and lifetime --------------------------------------------------------
    def owns(self, sandbox_id: str) -> bool:
        return sandbox_id in self._cpu_seconds

    async def sweep(
        self, tags: Sequence[str] = (), *, older_than_seconds: float | None = None, include_own: bool = False
    ) -> builtins.list[str]:
        """Delete this library's pods carrying all of ``tags`` (leftovers of crashed drivers), optionally only
        those older than ``older_than_seconds``; this backend's own pods only with ``include_own``.
        One ``deletecollection`` call when no age is given. Returns the names deleted."""
        wanted, min_age = validate_sweep(tags, older_than_seconds)
        parts = [f"{MANAGED_BY_LABEL}={MANAGED_BY}", *tag_selector(wanted)]
        if not include_own:
            parts.append(f"{DRIVER_LABEL}!={self.driver_id}")
        sel = selector(*parts)
        client, ns = await self._ensure()
        if min_age is None:
            doc = await client.request("DELETE", pods_path(ns), params=[("labelSelector", sel)], what="sweep pods")
            names = [i["metadata"]["name"] for i in doc.get("items") or [] if isinstance(i, dict)]
        else:
            names = sweep_victims(await self.list(wanted), min_age, lambda n: not include_own and self.owns(n))

            async def delete(name: str) -> None:
                await self._delete(name)

            names = await destroy_each(names, delete, "k8s")
        for name in names:  # gone (or going): status says COMPLETED, and the pod is no longer this backend's
            self._destroyed.add(name)
            self._cpu_seconds.pop(name, None)
        log.info("k8s sweep", tags=list(wanted), swept=len(names))
        return names

    async def set_lifetime(self, sandbox_id: str, seconds: float | None) -> None:
        """Make the pod's hard TTL end ``seconds`` from now (a pooled pod's TTL starts at lease); ``None``
        keeps the deadline it has. See ``_lifetime.set_lifetime`` for what Kubernetes allows."""
        if seconds is None:
            return
        validate_timeout(seconds, "seconds")
        if sandbox_id in self._destroyed:
            raise SandboxTerminatedError(
                f"sandbox {sandbox_id} was destroyed", sandbox_id=sandbox_id, infrastructure=False
            )
        client, ns = await self._ensure()
        watch = self._watch
        cached = watch.pods.get(sandbox_id) if watch is not None and watch.healthy else None
        await set_lifetime(client, self._pod_path(ns, sandbox_id), sandbox_id, seconds, cached=cached)

    async def aclose(self) -> None:
        """Stop the watch and background cleanups, delete any pod of this backend still alive
        (``sweep_on_close``), close connections. The caller bounds it (a close budget); each request
        has its own ``request_timeout_seconds``. A failed final sweep is logged: the pods' TTL ends them."""
        if self._closed:
            return
        self._closed = True
        if self._watch is not None:
            await self._watch.aclose()
        if self._cleanup is not None:
            await self._cleanup.aclose()
        await self._tasks.aclose()
        client, ns = self._client, self._namespace
        try:
            if client is not None and ns is not None and self._created_any and self.options.sweep_on_close:
                sel = selector(f"{MANAGED_BY_LABEL}={MANAGED_BY}", f"{DRIVER_LABEL}={self.driver_id}")
                try:
                    await client.request("DELETE", pods_path(ns), params=[("labelSelector", sel)], what="close")
                except SandboxError as exc:
                    log.warning("k8s final sweep failed", error=repr(exc))
        finally:
            if client is not None:
                await client.aclose()
