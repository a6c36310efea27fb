"""A Kubernetes API test server on a real socket: pods REST, watch streams, exec over WebSocket.

It speaks the wire protocol a client sees from kube-apiserver (JSON objects and
``Status`` errors, resourceVersions, chunked lists with ``continue``, newline-delimited
watch events with BOOKMARKs and ``410 Gone``, merge patches, deletecollection, and the
exec subresource's v4/v5 WebSocket channel protocol, see ``exec_server``). A pod's
lifecycle is simulated (Pending -> Running/Ready after ``ready_delay``) and exec runs
REAL local processes, each in a bubblewrap sandbox whose emptyDir mounts are
directories under the pod's own temp dir.

THIS IS NOT AN ISOLATION BOUNDARY: it is a test double for trusted test commands.

Pod faults are chosen by image name (``test/fault-<kind>[:<seconds>]``):
``unschedulable``, ``imagepull`` (ErrImagePull then ImagePullBackOff), ``stuck`` (Pending
forever), ``createconfig`` (CreateContainerConfigError), ``oomkilled`` (dies before Ready),
``evict`` (evicted ``seconds`` after Ready), ``oom`` (OOMKilled ``seconds`` after Ready).
Images from ``registry.invalid/`` fail to pull, as on a real cluster.
Request faults are queued with ``add_fault`` (429 with Retry-After, 500, dropped
connections, watch 410, exec without status...). Every request is recorded in
``requests`` so tests assert on what the client sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from .exec_server import ExecRunner, handle_exec
from .openapi import psa_restricted_violations, validate_pod
from .selectors import SelectorError, field_matcher, label_matcher

__all__ = ["Fault", "KubeTestServer", "Recorded"]

JSON_BODY = web.RequestKey("json_body", object)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
        **extra,
    }


def status_response(code: int, reason: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(status_body(code, reason, message), status=code, headers=headers)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@dataclass
class Fault:
    """One injected fault, consumed by the first ``times`` matching requests.

    ``kind``: ``status`` (reply ``status`` with a Status body, ``retry_after`` header),
    ``drop`` (close the connection without replying), ``drop_after`` (handle the request, then
    close without replying), ``delay`` (sleep ``seconds`` first), ``slow`` (sleep ``seconds``
    while counted in flight),
    ``watch_410`` (a watch request gets HTTP 410), ``exec_no_status`` (the command runs, the
    socket closes without a status), ``exec_status`` (reply ``status_json`` instead of the
    real status), ``exec_drop`` (close the socket right after the upgrade).
    """

    kind: str
    method: str | None = None
    path: str | None = None
    status: int = 500
    retry_after: float | None = None
    seconds: float = 0.0
    times: int = 1
    status_json: dict[str, Any] | None = None
    hits: int = 0

    def matches(self, method: str, path: str, kinds: tuple[str, ...]) -> bool:
        return (
            self.times > 0
            and self.kind in kinds
            and (self.method is None or self.method == method)
            and (self.path is None or re.search(self.path, path) is not None)
        )


@dataclass
class Recorded:
    method: str
    path: str
    query: list[tuple[str, str]]
    body: Any
    headers: dict[str, str]
    t: float
    watch: bool = False

    def param(self, key: str) -> str | None:
        return next((v for k, v in self.query if k == key), None)


@dataclass
class PodRuntime:
    obj: dict[str, Any]
    root: Path
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    deadline_task: asyncio.Task[None] | None = None
    execs: set[Any] = field(default_factory=set)
    start_monotonic: float | None = None


@dataclass
class _Watcher:
    namespace: str
    labels: Any
    fields: Any
    queue: asyncio.Queue[dict[str, Any] | None]


class KubeTestServer:
    """Start with ``await server.start()`` (returns the base URL); ``await server.stop()`` kills everything."""

    def __init__(
        self,
        *,
        ready_delay: float = 0.03,
        schedule_delay: float = 0.01,
        termination_delay: float = 0.05,
        bookmark_interval: float = 0.5,
        protocols: tuple[str, ...] = ("v5.channel.k8s.io", "v4.channel.k8s.io"),
        psa_restricted: bool = True,
        tokens: set[str] | None = None,
        ssl_context: Any = None,
        use_bwrap: bool = True,
    ) -> None:
        self.ready_delay = ready_delay
        self.schedule_delay = schedule_delay
        self.termination_delay = termination_delay
        self.bookmark_interval = bookmark_interval
        self.protocols = protocols
        self.psa_restricted = psa_restricted
        self.tokens = tokens
        self.ssl_context = ssl_context
        self.pods: dict[tuple[str, str], PodRuntime] = {}
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.rejected: list[tuple[str, list[str]]] = []
        self.rv = 100
        self.in_flight = 0
        self.max_in_flight = 0
        self.max_stdin_frame = 0
        self.exec_protocols: list[str] = []
        self.compacted_rv = 0
        self._history: list[tuple[int, str, dict[str, Any]]] = []
        self._watchers: list[_Watcher] = []
        self._bg: set[asyncio.Task[None]] = set()
        self._tmp = Path(tempfile.mkdtemp(prefix="k8s-test-server-"))
        self.runner = ExecRunner(use_bwrap=use_bwrap)
        self._web: web.AppRunner | None = None
        self.url = ""
        self.port = 0

    # -- server lifecycle ------------------------------------------------------
    async def start(self, port: int = 0) -> str:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/v1/namespaces/{ns}/pods", self._collection)
        app.router.add_route("*", "/api/v1/namespaces/{ns}/pods/{name}", self._item)
        app.router.add_route("*", "/api/v1/namespaces/{ns}/pods/{name}/exec", self._exec)
        app.router.add_get("/version", self._version)
        self._web = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self._web.setup()
        site = web.TCPSite(self._web, "127.0.0.1", port, ssl_context=self.ssl_context)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        self.url = f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"
        return self.url

    async def stop(self) -> None:
        for w in self._watchers:
            w.queue.put_nowait(None)
        for task in list(self._bg):
            task.cancel()
        for rt in list(self.pods.values()):
            self._cancel_tasks(rt)
            await self.runner.kill_all(rt)
        if self._web is not None:
            await self._web.cleanup()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _cancel_tasks(self, rt: PodRuntime) -> None:
        for t in rt.tasks:
            t.cancel()
        if rt.deadline_task is not None:
            rt.deadline_task.cancel()

    # -- test API ----------------------------------------------------------------
    def add_fault(self, kind: str, **kw: Any) -> Fault:
        fault = Fault(kind, **kw)
        self.faults.append(fault)
        return fault

    def take_fault(self, method: str, path: str, *kinds: str) -> Fault | None:
        for fault in self.faults:
            if fault.matches(method, path, kinds):
                fault.times -= 1
                fault.hits += 1
                return fault
        return None

    def live_pods(self, namespace: str | None = None) -> list[str]:
        return sorted(n for (ns, n) in self.pods if namespace is None or ns == namespace)

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.pods[(namespace, name)].obj

    def calls(self, method: str | None = None, pattern: str = "", *, watch: bool | None = None) -> list[Recorded]:
        return [
            r
            for r in self.requests
            if (method is None or r.method == method)
            and re.search(pattern, r.path)
            and (watch is None or r.watch == watch)
        ]

    def events(self, name: str) -> list[str]:
        """The watch event types the server emitted for pod ``name`` (ADDED, MODIFIED..., DELETED)."""
        return [kind for _, kind, obj in self._history if obj["metadata"]["name"] == name]

    def expire_watches(self) -> None:
        """Compact history: open watches get an ERROR 410 event; older resourceVersions are gone."""
        self.compacted_rv = self.rv
        for w in list(self._watchers):
            w.queue.put_nowait(
                {"type": "ERROR", "object": status_body(410, "Expired", "too old resource version: compacted")}
            )
            w.queue.put_nowait(None)

    async def evict(self, name: str, namespace: str = "default") -> None:
        await self._fail_pod(
            self.pods[(namespace, name)],
            reason="Evicted",
            message="The node was low on resource: memory. Threshold quantity: 100Mi.",
            container_reason="ContainerStatusUnknown",
            exit_code=137,
            disruption=True,
        )

    async def delete_pod(self, name: str, namespace: str = "default", grace: int | None = 0) -> None:
        """Delete a pod behind the client's back (another controller, a user with kubectl)."""
        await self._delete(self.pods[(namespace, name)], grace)

    async def oom_kill(self, name: str, namespace: str = "default") -> None:
        await self._fail_pod(
            self.pods[(namespace, name)], reason=None, message=None, container_reason="OOMKilled", exit_code=137
        )

    # -- plumbing ----------------------------------------------------------------
    def _bump(self, rt: PodRuntime, kind: str = "MODIFIED") -> None:
        self.rv += 1
        rt.obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(kind, rt.obj)

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        snap = copy.deepcopy(obj)
        self._history.append((self.rv, kind, snap))
        if len(self._history) > 5000:
            del self._history[:1000]
            self.compacted_rv = max(self.compacted_rv, self._history[0][0] - 1)
        for w in self._watchers:
            if self._visible(w, snap):
                w.queue.put_nowait({"type": kind, "object": snap})

    @staticmethod
    def _visible(w: _Watcher, obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        return meta.get("namespace") == w.namespace and w.labels(meta.get("labels") or {}) and w.fields(obj)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body: Any = None
        if request.can_read_body and request.path.find("/exec") < 0:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                return status_response(400, "BadRequest", "body is not JSON")
        watch = request.query.get("watch") in ("1", "true")
        self.requests.append(
            Recorded(
                request.method,
                request.path,
                list(request.query.items()),
                body,
                {k: v for k, v in request.headers.items()},
                time.monotonic(),
                watch,
            )
        )
        request[JSON_BODY] = body
        if self.tokens is not None:
            auth = request.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
                return status_response(401, "Unauthorized", "Unauthorized")
        if (f := self.take_fault(request.method, request.path, "delay")) is not None:
            await asyncio.sleep(f.seconds)
        kinds = ("status", "drop", "watch_410", "drop_after") if watch else ("status", "drop", "drop_after")
        if (f := self.take_fault(request.method, request.path, *kinds)) is not None:
            if f.kind == "drop_after":  # the request takes effect, the reply is lost
                await handler(request)
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError
            if f.kind == "drop":
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError  # nothing more to say on a dropped connection
            if f.kind == "watch_410":
                return status_response(410, "Expired", "too old resource version")
            headers = {"Retry-After": f"{f.retry_after:g}"} if f.retry_after is not None else None
            reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}.get(f.status, "Unknown")
            return status_response(f.status, reason, f"injected {f.status}", headers)
        if watch or request.path.endswith("/exec"):
            return await handler(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if (f := self.take_fault(request.method, request.path, "slow")) is not None:
                await asyncio.sleep(f.seconds)
            return await handler(request)
        finally:
            self.in_flight -= 1

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "34", "gitVersion": "v1.34.0-cwsandbox-test"})

    # -- collection: list, watch, create, deletecollection -------------------------
    def _selected(self, request: web.Request) -> list[PodRuntime]:
        ns = request.match_info["ns"]
        labels = label_matcher(request.query.get("labelSelector", ""))
        fields = field_matcher(request.query.get("fieldSelector", ""))
        return [
            rt
            for (pns, name), rt in sorted(self.pods.items())
            if pns == ns and labels(rt.obj["metadata"].get("labels") or {}) and fields(rt.obj)
        ]

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        try:
            if request.method == "GET":
                if request.query.get("watch") in ("1", "true"):
                    return await self._watch(request)
                return self._list(request)
            if request.method == "POST":
                return await self._create(request)
            if request.method == "DELETE":
                items = []
                for rt in self._selected(request):
                    await self._delete(rt, None)
                    items.append(copy.deepcopy(rt.obj))
                return web.json_response(
                    {
                        "kind": "PodList",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(self.rv)},
                        "items": items,
                    }
                )
        except SelectorError as exc:
            return status_response(400, "BadRequest", str(exc))
        return status_response(405, "MethodNotAllowed", "method not allowed")

    def _list(self, request: web.Request) -> web.Response:
        selected = self._selected(request)
        limit = int(request.query.get("limit", "0") or 0)
        start, list_rv = 0, self.rv
        if cont := request.query.get("continue"):
            token = json.loads(base64.b64decode(cont))
            if token["rv"] <= self.compacted_rv:
                return status_response(410, "Expired", "The provided continue parameter is too old")
            start, list_rv = token["start"], token["rv"]
        page = selected[start : start + limit] if limit else selected[start:]
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if limit and start + limit < len(selected):
            meta["continue"] = base64.b64encode(json.dumps({"rv": list_rv, "start": start + limit}).encode()).decode()
            meta["remainingItemCount"] = len(selected) - start - limit
        return web.json_response(
            {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": [copy.deepcopy(p.obj) for p in page]}
        )

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["ns"]
        w = _Watcher(
            ns,
            label_matcher(request.query.get("labelSelector", "")),
            field_matcher(request.query.get("fieldSelector", "")),
            asyncio.Queue(),
        )
        rv_param = request.query.get("resourceVersion", "")
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        await resp.prepare(request)
        if rv_param not in ("", "0") and int(rv_param) < self.compacted_rv:
            err = status_body(410, "Expired", f"too old resource version: {rv_param} ({self.compacted_rv})")
            await resp.write(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
            return resp
        if rv_param in ("", "0"):
            for rt in self._selected(request):
                w.queue.put_nowait({"type": "ADDED", "object": copy.deepcopy(rt.obj)})
        else:
            for rv, kind, obj in self._history:
                if rv > int(rv_param) and self._visible(w, obj):
                    w.queue.put_nowait({"type": kind, "object": obj})
        self._watchers.append(w)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    event = await asyncio.wait_for(w.queue.get(), min(left, self.bookmark_interval))
                except TimeoutError:
                    if bookmarks:
                        bm = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}}
                        await resp.write(json.dumps({"type": "BOOKMARK", "object": bm}).encode() + b"\n")
                    continue
                if event is None:
                    break
                await resp.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, RuntimeError):
            pass
        finally:
            self._watchers.remove(w)
        return resp

    async def _create(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        pod = request[JSON_BODY]
        if not isinstance(pod, dict):
            return status_response(400, "BadRequest", "body must be a Pod")
        errors = validate_pod(pod)
        name = (pod.get("metadata") or {}).get("name", "")
        if errors:
            self.rejected.append((name, errors))
            return status_response(422, "Invalid", f'Pod "{name}" is invalid: ' + "; ".join(errors))
        if self.psa_restricted and (violations := psa_restricted_violations(pod)):
            self.rejected.append((name, violations))
            msg = f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": ' + ", ".join(violations)
            return status_response(403, "Forbidden", msg)
        if (ns, name) in self.pods:
            return status_response(409, "AlreadyExists", f'pods "{name}" already exists')
        obj = copy.deepcopy(pod)
        meta = obj["metadata"]
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        obj["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": []}
        root = self._tmp / f"{ns}-{name}"
        root.mkdir()
        rt = PodRuntime(obj=obj, root=root)
        self.pods[(ns, name)] = rt
        self._bump(rt, "ADDED")
        rt.tasks.append(asyncio.get_running_loop().create_task(self._lifecycle(rt)))
        return web.json_response(copy.deepcopy(obj), status=201)

    # -- one pod: get, patch, delete ------------------------------------------------
    async def _item(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        rt = self.pods.get((ns, name))
        if rt is None:
            return status_response(404, "NotFound", f'pods "{name}" not found')
        if request.method == "GET":
            return web.json_response(copy.deepcopy(rt.obj))
        if request.method == "DELETE":
            opts = request[JSON_BODY] or {}
            pre = (opts.get("preconditions") or {}).get("uid")
            if pre and pre != rt.obj["metadata"]["uid"]:
                return status_response(409, "Conflict", "Precondition failed: UID in precondition")
            await self._delete(rt, opts.get("gracePeriodSeconds"))
            return web.json_response(copy.deepcopy(rt.obj))
        if request.method == "PATCH":
            return await self._patch(rt, request)
        return status_response(405, "MethodNotAllowed", "method not allowed")

    async def _patch(self, rt: PodRuntime, request: web.Request) -> web.Response:
        ctype = request.content_type
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return status_response(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format {ctype}"
            )
        patch = request[JSON_BODY] or {}
        want_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if want_rv and want_rv != rt.obj["metadata"]["resourceVersion"]:
            return status_response(409, "Conflict", "the object has been modified; please apply your changes")
        new = merge_patch(rt.obj, patch)
        old_spec, new_spec = rt.obj["spec"], new.get("spec") or {}
        changed = {k for k in set(old_spec) | set(new_spec) if old_spec.get(k) != new_spec.get(k)}
        if changed - {"activeDeadlineSeconds"}:
            return status_response(
                422, "Invalid", f"spec: Forbidden: pod updates may not change fields {sorted(changed)}"
            )
        old_ads, new_ads = old_spec.get("activeDeadlineSeconds"), new_spec.get("activeDeadlineSeconds")
        if "activeDeadlineSeconds" in changed and (
            new_ads is None or (old_ads is not None and new_ads > old_ads) or new_ads < 1
        ):
            return status_response(
                422,
                "Invalid",
                "spec.activeDeadlineSeconds: Invalid value: must be less than or equal to previous value",
            )
        new["status"] = rt.obj["status"]
        rt.obj = new
        self._bump(rt)
        if "activeDeadlineSeconds" in changed:
            self._arm_deadline(rt)
        return web.json_response(copy.deepcopy(rt.obj))

    async def _delete(self, rt: PodRuntime, grace: int | None) -> None:
        meta = rt.obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if grace is None:
            grace = rt.obj["spec"].get("terminationGracePeriodSeconds", 30)
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = now_rfc3339()
            meta["deletionGracePeriodSeconds"] = grace
            self._bump(rt)
            self._cancel_tasks(rt)
            after = 0 if grace == 0 else min(grace, self.termination_delay)
            task = asyncio.get_running_loop().create_task(self._finish_delete(ns, name, after))
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        await self.runner.kill_all(rt)

    async def _finish_delete(self, ns: str, name: str, after: float) -> None:
        await asyncio.sleep(after)
        rt = self.pods.pop((ns, name), None)
        if rt is None:
            return
        await self.runner.kill_all(rt)
        self._bump(rt, "DELETED")
        shutil.rmtree(rt.root, ignore_errors=True)

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        return await handle_exec(self, request)

    # -- lifecycle -------------------------------------------------------------------
    def _set(self, rt: PodRuntime, *, phase: str | None = None, **status: Any) -> None:
        st = rt.obj["status"]
        if phase:
            st["phase"] = phase
        st.update(status)
        self._bump(rt)

    @staticmethod
    def _cond(kind: str, value: bool, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"type": kind, "status": "True" if value else "False", "lastTransitionTime": now_rfc3339()}
        if reason:
            c["reason"] = reason
        if message:
            c["message"] = message
        return c

    def _container(self, rt: PodRuntime, state: dict[str, Any], ready: bool = False) -> list[dict[str, Any]]:
        c = rt.obj["spec"]["containers"][0]
        return [
            {"name": c["name"], "image": c["image"], "imageID": "", "ready": ready, "restartCount": 0, "state": state}
        ]

    async def _lifecycle(self, rt: PodRuntime) -> None:
        image = rt.obj["spec"]["containers"][0]["image"]
        m = re.search(r"fault-([a-z]+)(?::([0-9.]+))?", image)
        fault, arg = (m.group(1), float(m.group(2) or 0.2)) if m else (None, 0.0)
        if image.startswith("registry.invalid/"):  # a registry that cannot exist (RFC 6761)
            fault = "imagepull"
        await asyncio.sleep(self.schedule_delay)
        if fault == "unschedulable":
            msg = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available."
            self._set(rt, conditions=[self._cond("PodScheduled", False, "Unschedulable", msg)])
            return
        rt.obj["spec"]["nodeName"] = "test-node-1"
        rt.start_monotonic = time.monotonic()
        waiting = {"waiting": {"reason": "ContainerCreating"}}
        self._set(
            rt,
            startTime=now_rfc3339(),
            hostIP="10.0.0.1",
            conditions=[self._cond("PodScheduled", True), self._cond("Ready", False, "ContainersNotReady")],
            containerStatuses=self._container(rt, waiting),
        )
        self._arm_deadline(rt)
        if fault == "stuck":
            return
        if fault in ("imagepull", "createconfig"):
            await asyncio.sleep(self.ready_delay)
            if fault == "createconfig":
                msg = "container has runAsNonRoot and image will run as root"
                self._set(
                    rt,
                    containerStatuses=self._container(
                        rt, {"waiting": {"reason": "CreateContainerConfigError", "message": msg}}
                    ),
                )
                return
            err = f'Failed to pull image "{image}": rpc error: code = NotFound desc = not found'
            self._set(
                rt, containerStatuses=self._container(rt, {"waiting": {"reason": "ErrImagePull", "message": err}})
            )
            await asyncio.sleep(self.ready_delay)
            backoff = f'Back-off pulling image "{image}"'
            self._set(
                rt,
                containerStatuses=self._container(rt, {"waiting": {"reason": "ImagePullBackOff", "message": backoff}}),
            )
            return
        await asyncio.sleep(self.ready_delay)
        if fault == "oomkilled":
            await self._fail_pod(rt, reason=None, message=None, container_reason="OOMKilled", exit_code=137)
            return
        running = {"running": {"startedAt": now_rfc3339()}}
        self._set(
            rt,
            phase="Running",
            podIP="10.1.0.5",
            conditions=[
                self._cond("PodScheduled", True),
                self._cond("Initialized", True),
                self._cond("ContainersReady", True),
                self._cond("Ready", True),
            ],
            containerStatuses=self._container(rt, running, ready=True),
        )
        if fault in ("evict", "oom"):
            await asyncio.sleep(arg)
            if fault == "evict":
                await self.evict(rt.obj["metadata"]["name"], rt.obj["metadata"]["namespace"])
            else:
                await self.oom_kill(rt.obj["metadata"]["name"], rt.obj["metadata"]["namespace"])

    def _arm_deadline(self, rt: PodRuntime) -> None:
        ads = rt.obj["spec"].get("activeDeadlineSeconds")
        if rt.deadline_task is not None:
            rt.deadline_task.cancel()
            rt.deadline_task = None
        if ads is None or rt.start_monotonic is None:
            return

        async def fire() -> None:
            assert rt.start_monotonic is not None
            await asyncio.sleep(max(0.0, rt.start_monotonic + ads - time.monotonic()))
            await self._fail_pod(
                rt,
                reason="DeadlineExceeded",
                message="Pod was active on the node longer than the specified deadline",
                container_reason="Error",
                exit_code=137,
            )

        rt.deadline_task = asyncio.get_running_loop().create_task(fire())

    async def _fail_pod(
        self,
        rt: PodRuntime,
        *,
        reason: str | None,
        message: str | None,
        container_reason: str,
        exit_code: int,
        disruption: bool = False,
    ) -> None:
        if rt.obj["status"].get("phase") in ("Failed", "Succeeded"):
            return
        terminated = {"terminated": {"exitCode": exit_code, "reason": container_reason, "finishedAt": now_rfc3339()}}
        conds = [self._cond("Ready", False, "PodFailed")]
        if disruption:
            conds.append(self._cond("DisruptionTarget", True, "TerminationByKubelet", message))
        extra: dict[str, Any] = {}
        if reason:
            extra["reason"] = reason
        if message:
            extra["message"] = message
        self._set(rt, phase="Failed", conditions=conds, containerStatuses=self._container(rt, terminated), **extra)
        await self.runner.kill_all(rt)


async def serve_forever(port: int = 0, **options: Any) -> None:
    """Run a test server until cancelled, printing its URL on the first line of stdout (benchmarks use this)."""
    server = KubeTestServer(**options)
    url = await server.start(port)
    print(url, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    """``python -c 'from k8s.server import main; main()' [--port N] [--ready-delay S]`` with tests/ on sys.path."""
    import argparse

    parser = argparse.ArgumentParser(description="Kubernetes API test server (not an isolation boundary)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-delay", type=float, default=0.03)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(args.port, ready_delay=args.ready_delay))
