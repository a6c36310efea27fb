"""A Kubernetes API test server on a real socket: pods REST, watch streams, exec over WebSocket.

It speaks the wire protocol a client sees from kube-apiserver (JSON objects and
``Status`` errors on every path, discovery at ``/api``, ``/apis`` and ``/api/v1`` so kubectl
works, resourceVersions, chunked lists with ``continue``, newline-delimited watch events
with BOOKMARKs and ``410 Gone``, merge patches, deletecollection, and the exec
subresource's v4/v5 WebSocket channel protocol, see ``exec_server``). A pod's lifecycle is
simulated (Pending -> Running/Ready after ``ready_delay``); a running pod is a REAL
container (``container``: a bubblewrap process tree with the pod's command as PID 1,
emptyDir mounts as directories under the pod's temp dir) that every exec joins.

Where a real cluster is less kind than a simple fake, this server is as unkind:

- a closed exec socket leaves its command running; a container that dies mid-exec reports
  137 on the status channel before the pod turns Failed (``status_lag`` later), or hangs
  or closes without a status (``on_container_death``);
- watches with a label or field selector see an object entering the selection as ADDED and
  leaving it as DELETED; history is compacted every ``compaction_interval`` seconds, so a
  watch or a ``continue`` token from before then gets 410 Gone;
- request lines and headers up to Go's ``MaxHeaderBytes`` (1 MiB) are accepted.

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
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from .exec_server import handle_exec
from .lifecycle import PodLifecycle
from .openapi import drop_unknown_fields, field_path, psa_restricted_violations, unknown_fields, validate_pod
from .selectors import SelectorError, field_matcher, label_matcher
from .state import Fault, PodRuntime, Recorded, merge_patch, now_rfc3339, status_body, status_response

__all__ = ["Fault", "KubeTestServer", "PodRuntime", "Recorded", "status_response"]

JSON_BODY = web.RequestKey("json_body", object)


@dataclass
class _Watcher:
    namespace: str
    labels: Any
    fields: Any
    queue: asyncio.Queue[dict[str, Any] | None]


class KubeTestServer(PodLifecycle):
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
        status_lag: float = 0.3,
        on_container_death: str = "status",
        compaction_interval: float = 5.0,
    ) -> None:
        self.ready_delay = ready_delay
        self.schedule_delay = schedule_delay
        self.termination_delay = termination_delay
        self.bookmark_interval = bookmark_interval
        self.protocols = protocols
        self.psa_restricted = psa_restricted
        self.tokens = tokens
        self.ssl_context = ssl_context
        self.status_lag = status_lag
        assert on_container_death in ("status", "hang", "close")
        self.on_container_death = on_container_death
        self.compaction_interval = compaction_interval
        self.watch_lag = 0.0
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
        self._history: list[tuple[int, str, dict[str, Any] | None, dict[str, Any]]] = []
        self._last: dict[tuple[str, str], dict[str, Any]] = {}
        self._tick_rv = self.rv
        self._watchers: list[_Watcher] = []
        self._exec_sockets: dict[tuple[str, str], set[Any]] = {}
        self._bg: set[asyncio.Task[None]] = set()
        self._tmp = Path(tempfile.mkdtemp(prefix="k8s-test-server-"))
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
        app.router.add_get("/api", self._api_versions)
        app.router.add_get("/apis", self._api_groups)
        app.router.add_get("/api/v1", self._api_resources)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        self._web = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=1.0,
            # Go's http.Server: MaxHeaderBytes 1 MiB for the request line and headers (aiohttp: 8 KiB)
            max_line_size=1 << 20,
            max_field_size=1 << 20,
        )
        await self._web.setup()
        site = web.TCPSite(self._web, "127.0.0.1", port, ssl_context=self.ssl_context)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        self.url = f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"
        self._spawn(self._compact_forever())
        return self.url

    async def stop(self) -> None:
        for w in self._watchers:
            w.queue.put_nowait(None)
        for task in list(self._bg):
            task.cancel()
        for rt in list(self.pods.values()):
            self._cancel_tasks(rt)
            if rt.container is not None:
                await rt.container.stop()
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

    def take_fault(self, method: str, path: str, *kinds: str, query: str = "") -> Fault | None:
        for fault in self.faults:
            if fault.matches(method, path, kinds, query):
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
        return [kind for _, kind, _, obj in self._history if obj["metadata"]["name"] == name]

    def processes(self, name: str, namespace: str = "default") -> list[tuple[int, str]]:
        """Processes running in the pod's container besides its idle PID 1 (host pid, command line)."""
        rt = self.pods.get((namespace, name))
        return rt.container.processes() if rt is not None and rt.container is not None else []

    def drop_exec_streams(self, name: str, namespace: str = "default") -> None:
        """Break every open exec socket of a pod (a proxy or load balancer dropped them); commands run on."""
        for ws in list(self._exec_sockets.get((namespace, name), ())):
            transport = ws._req.transport if ws._req is not None else None
            if transport is not None:
                transport.abort()

    def expire_watches(self) -> None:
        """Compact history now and end every open watch with an ERROR 410 event (a watch cache reset)."""
        self.compacted_rv = self.rv
        self._history.clear()
        for w in list(self._watchers):
            w.queue.put_nowait(
                {"type": "ERROR", "object": status_body(410, "Expired", "too old resource version: compacted")}
            )
            w.queue.put_nowait(None)

    async def delete_pod(self, name: str, namespace: str = "default", grace: int | None = 0) -> None:
        """Delete a pod behind the client's back (another controller, a user with kubectl)."""
        await self._delete(self.pods[(namespace, name)], grace)

    # -- plumbing ----------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def detach(self, rt: PodRuntime, proc: Any, pumps: Any) -> None:
        """An exec whose client went away: it runs on; reap it when it ends."""

        async def reap() -> None:
            with contextlib.suppress(Exception):
                await pumps
                await proc.wait()
            if rt.container is not None:
                rt.container.execs.discard(proc)

        self._spawn(reap())

    async def _compact_forever(self) -> None:
        """etcd compacts on a timer: resourceVersions older than the last tick are gone."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(self.compaction_interval, 0.05))  # a changed interval applies at once
            if time.monotonic() - last < self.compaction_interval:
                continue
            last = time.monotonic()
            self.compacted_rv = max(self.compacted_rv, self._tick_rv)
            self._tick_rv = self.rv
            self._history = [h for h in self._history if h[0] > self.compacted_rv]

    def _bump(self, rt: PodRuntime, kind: str = "MODIFIED") -> None:
        self.rv += 1
        rt.obj["metadata"]["resourceVersion"] = str(self.rv)
        meta = rt.obj["metadata"]
        key = (meta["namespace"], meta["name"])
        snap = copy.deepcopy(rt.obj)
        prev = self._last.pop(key, None) if kind == "DELETED" else self._last.get(key)
        if kind != "DELETED":
            self._last[key] = snap
        self._history.append((self.rv, kind, prev, snap))
        for w in self._watchers:
            if (event := self._event_for(w, kind, prev, snap)) is not None:
                w.queue.put_nowait(event)

    @staticmethod
    def _visible(w: _Watcher, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        return meta.get("namespace") == w.namespace and w.labels(meta.get("labels") or {}) and w.fields(obj)

    def _event_for(
        self, w: _Watcher, kind: str, prev: dict[str, Any] | None, snap: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The event one watcher sees: an object entering its selection is ADDED, one leaving it DELETED."""
        was, now = self._visible(w, prev), self._visible(w, snap)
        if kind == "DELETED":
            return {"type": "DELETED", "object": snap} if was or now else None
        if now:
            return {"type": "MODIFIED" if was else "ADDED", "object": snap}
        return {"type": "DELETED", "object": snap} if was else None

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
        query = urllib.parse.unquote_plus(request.query_string)
        if (f := self.take_fault(request.method, request.path, "delay", query=query)) is not None:
            if f.gate is not None:
                await f.gate.wait()
            else:
                await asyncio.sleep(f.seconds)
        kinds = ("status", "drop", "watch_410", "drop_after") if watch else ("status", "drop", "drop_after")
        if (f := self.take_fault(request.method, request.path, *kinds, query=query)) is not None:
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
            if f.text is not None:
                return web.Response(status=f.status, text=f.text, headers=headers)
            reason = {403: "Forbidden", 404: "NotFound", 429: "TooManyRequests", 500: "InternalError"}.get(
                f.status, "Unknown"
            )
            return status_response(f.status, reason, f.message or f"injected {f.status}", headers)
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
        return web.json_response(
            {"major": "1", "minor": "34", "gitVersion": "v1.34.0-cwsandbox-test", "platform": "linux/amd64"}
        )

    async def _api_versions(self, request: web.Request) -> web.Response:
        cidr = [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}]
        return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidr})

    async def _api_groups(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    async def _api_resources(self, request: web.Request) -> web.Response:
        pod_verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        resources = [
            {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": pod_verbs,
             "shortNames": ["po"], "categories": ["all"]},
            {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions",
             "verbs": ["create", "get"]},
        ]  # fmt: skip
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})

    async def _not_found(self, request: web.Request) -> web.Response:
        return status_response(404, "NotFound", "the server could not find the requested resource")

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
            if token["rv"] < self.compacted_rv:
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
        if rv_param not in ("", "0") and int(rv_param) < self.compacted_rv:  # the apiserver says so in an event
            err = status_body(410, "Expired", f"too old resource version: {rv_param} ({self.compacted_rv})")
            await resp.write(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
            return resp
        if rv_param in ("", "0"):
            for rt in self._selected(request):
                w.queue.put_nowait({"type": "ADDED", "object": copy.deepcopy(rt.obj)})
        else:
            for rv, kind, prev, obj in self._history:
                if rv > int(rv_param) and (event := self._event_for(w, kind, prev, obj)) is not None:
                    w.queue.put_nowait(event)
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
                if self.watch_lag:
                    await asyncio.sleep(self.watch_lag)  # a slow watch: events arrive after later writes
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
        name = (pod.get("metadata") or {}).get("name", "")
        warnings: list[str] = []
        if unknown := unknown_fields(pod):  # kube-apiserver's decoder, per fieldValidation (default Warn)
            texts = [f'unknown field "{field_path(loc)}"' for loc in unknown]
            mode = request.query.get("fieldValidation", "Warn")
            if mode == "Strict":
                self.rejected.append((name, texts))
                msg = 'Pod in version "v1" cannot be handled as a Pod: strict decoding error: ' + ", ".join(texts)
                return status_response(400, "BadRequest", msg)
            pod = copy.deepcopy(pod)
            drop_unknown_fields(pod, unknown)
            if mode == "Warn":
                warnings = texts
        errors = validate_pod(pod)
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
        resp = web.json_response(copy.deepcopy(obj), status=201)
        for text in warnings:
            resp.headers.add("Warning", '299 - "' + text.replace('"', '\\"') + '"')
        return resp

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
            self._spawn(self._finish_delete(ns, name, after))
        if rt.container is not None:  # the idle PID 1 exits on SIGTERM at once; running execs die with it
            await rt.container.stop(0)

    async def _finish_delete(self, ns: str, name: str, after: float) -> None:
        await asyncio.sleep(after)
        rt = self.pods.pop((ns, name), None)
        if rt is None:
            return
        if rt.container is not None:
            await rt.container.stop(0)
        self._bump(rt, "DELETED")
        shutil.rmtree(rt.root, ignore_errors=True)

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        return await handle_exec(self, request)


async def serve_forever(port: int = 0, **options: Any) -> None:
    """Run a test server until cancelled, printing its URL on the first line of stdout (benchmarks use this)."""
    import signal

    server = KubeTestServer(**options)
    url = await server.start(port)
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)  # clean up on terminate()
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
    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(serve_forever(args.port, ready_delay=args.ready_delay))
