"""One shared watch per backend: list, then watch from the list's resourceVersion, fan out to waiters.

The loop (kubernetes.md section 2): ``GET pods?labelSelector=<driver>`` gives the
current pods and a resourceVersion; ``GET pods?watch=1&resourceVersion=<rv>&
allowWatchBookmarks=true&timeoutSeconds=N`` then streams newline-delimited events.
BOOKMARK events only move the resourceVersion. When a watch ends it is resumed from
the last resourceVersion; ``410 Gone`` (as an HTTP status or an ``ERROR`` event)
means that version is too old, so the loop lists again. Other errors back off
(jittered, capped) and list again.

Waiters (``wait_ready``) block on a per-pod event set on every change, so N pods
starting cost one watch, not N polls. As a safety net a waiter that has heard nothing
for ``stale`` seconds (``down_poll`` while the watch is down) GETs its pod once.
"""

from __future__ import annotations

import json
import random
import time
import traceback
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import anyio
from anyio.abc import TaskGroup

from ..._errors import SandboxBackendUnavailableError, SandboxTimeoutError
from ..._log import log
from ._client import KubeApiError, KubeClient
from ._inventory import list_pods, pods_path
from ._podstate import PodView, view

__all__ = ["PodWatch"]


class _Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


class PodWatch:
    """Keeps ``pods`` (name -> latest Pod) current for one label selector and wakes waiters on change."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        label_selector: str,
        *,
        watch_timeout: int,
        stale: float,
        down_poll: float,
        max_backoff: float,
        on_change: Callable[[str, dict[str, Any] | None], None] | None = None,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._selector = label_selector
        self._watch_timeout = watch_timeout
        self._stale, self._down_poll, self._max_backoff = stale, down_poll, max_backoff
        self._on_change = on_change
        self.pods: dict[str, dict[str, Any]] = {}
        self._gone: dict[str, None] = {}  # names seen deleted (insertion-ordered, bounded)
        self._signals: dict[str, anyio.Event] = {}
        self._started = False
        self._scope = anyio.CancelScope()
        self._ended = anyio.Event()
        self.healthy = False
        self.denied: SandboxBackendUnavailableError | None = None  # the last list/watch refused (RBAC)
        self.relists = 0
        self.watches = 0
        self.bookmarks = 0

    # -- lifecycle -------------------------------------------------------------
    def start(self, tg: TaskGroup) -> None:
        """Start the watch once in ``tg`` (the backend's task group; idempotent). It runs in its own
        cancel scope until ``aclose``."""
        if not self._started:
            self._started = True
            tg.start_soon(self._run_scoped, name="cwsandbox-k8s-watch")

    async def _run_scoped(self) -> None:
        try:
            with self._scope:
                await self._run()
        finally:
            self._ended.set()

    async def aclose(self) -> None:
        """Stop the watch and wait for its task to end (the caller bounds the wait)."""
        self._scope.cancel()
        if self._started:
            await self._ended.wait()
        self.healthy = False

    # -- state -----------------------------------------------------------------
    def observe(self, name: str, pod: dict[str, Any] | None, *, fresh: bool = True) -> None:
        """Record ``pod`` (None: deleted). ``fresh=False`` only fills a gap (a create response)."""
        if not fresh and name in self.pods:
            return
        if pod is None:
            if self.pods.pop(name, None) is not None:
                self._gone[name] = None
                while len(self._gone) > 10_000:
                    del self._gone[next(iter(self._gone))]
        else:
            self.pods[name] = pod
        ev = self._signals.pop(name, None)
        if ev is not None:
            ev.set()
        if self._on_change is not None:
            self._on_change(name, pod)

    def view(self, name: str) -> PodView | None:
        """The cached view of ``name``; None if the watch has not seen it (unknown, not necessarily gone)."""
        pod = self.pods.get(name)
        return view(name, pod) if pod is not None else None

    async def wait_ready(self, name: str, *, within: float, unschedulable_grace: float) -> PodView:
        """Wait until the pod is Ready. Raises ``SandboxCreationError`` (with the pod's reason) as soon as it
        fails, is deleted, or stays Unschedulable past ``unschedulable_grace``; ``SandboxTimeoutError`` after
        ``within`` seconds with the last state seen."""
        deadline = time.monotonic() + within
        unschedulable_since: float | None = None
        last = PodView(name=name, exists=True)
        quiet_since = time.monotonic()
        while True:
            ev = self._signals.setdefault(name, anyio.Event())
            pod = self.pods.get(name)
            if pod is not None:
                last = view(name, pod)
                if last.ready:
                    return last
                if last.dead:
                    raise last.creation_error()
                if last.unschedulable is not None:
                    unschedulable_since = unschedulable_since or time.monotonic()
                    if time.monotonic() - unschedulable_since >= unschedulable_grace:
                        raise last.creation_error()
                else:
                    unschedulable_since = None
            if self.denied is not None:
                raise SandboxBackendUnavailableError(str(self.denied), sandbox_id=name, infrastructure=False)
            now = time.monotonic()
            if now >= deadline:
                raise SandboxTimeoutError(
                    f"pod {name} not ready within {within:g} s: {last.describe()}", sandbox_id=name
                )
            wait = min(deadline - now, self._stale if self.healthy else self._down_poll)
            if unschedulable_since is not None:
                wait = min(wait, max(0.05, unschedulable_since + unschedulable_grace - now))
            with anyio.move_on_after(wait):
                await ev.wait()
                quiet_since = time.monotonic()
                continue
            if time.monotonic() - quiet_since >= (self._stale if self.healthy else self._down_poll):
                await self.refresh(name)
                quiet_since = time.monotonic()

    def seen_deleted(self, name: str) -> bool:
        """Whether the watch has seen ``name`` deleted (recent names only)."""
        return name in self._gone

    async def wait_dead(self, name: str) -> PodView:
        """Return once the watch has seen ``name`` dead (failed, terminating or deleted). Waits forever
        otherwise: the caller bounds it."""
        while True:
            ev = self._signals.setdefault(name, anyio.Event())
            current = self.view(name)
            if current is not None and current.dead:
                return current
            if current is None and self.seen_deleted(name):
                return view(name, None)
            await ev.wait()

    async def refresh(self, name: str) -> PodView:
        """GET one pod and record it (the safety net and the error path use this)."""
        try:
            pod: dict[str, Any] | None = await self._client.request(
                "GET", f"{pods_path(self._namespace)}/{quote(name, safe='')}", what=f"get pod {name}"
            )
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            pod = None
        self.observe(name, pod)
        return view(name, pod)

    # -- the loop --------------------------------------------------------------
    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                rv = await self._relist()
                self.healthy, failures = True, 0
                while True:
                    rv = await self._watch_once(rv)
            except _Gone:
                log.debug("k8s watch: resourceVersion too old; relisting")
                continue
            except (KubeApiError, SandboxBackendUnavailableError, SandboxTimeoutError, OSError, ValueError) as exc:
                self.healthy = False
                self._refused(exc)
                failures += 1
                delay = min(self._max_backoff, 0.2 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0)
                log.info("k8s watch failed; retrying", error=repr(exc), delay=round(delay, 2))
                await anyio.sleep(delay)
            except Exception:  # a bug: shown at ERROR, and the shared watch restarts rather than die silently
                self.healthy = False
                log.error("k8s watch crashed (a bug); restarting", error=traceback.format_exc())
                await anyio.sleep(self._max_backoff)

    def _refused(self, exc: BaseException) -> None:
        """A list or watch the caller's RBAC rules (or credentials) refuse: waiters fail with it, not time out."""
        if isinstance(exc, KubeApiError) and exc.status == 403:
            exc = SandboxBackendUnavailableError(f"{exc.message} (check the RBAC rules)", infrastructure=False)
        if isinstance(exc, SandboxBackendUnavailableError) and not exc.infrastructure:
            self.denied = exc
            signals, self._signals = self._signals, {}
            for ev in signals.values():
                ev.set()

    async def _relist(self) -> str:
        self.relists += 1
        pods, rv = await list_pods(self._client, self._namespace, self._selector)
        seen = {p["metadata"]["name"]: p for p in pods}
        for name in [n for n in self.pods if n not in seen]:
            self.observe(name, None)
        for name, pod in seen.items():
            self.observe(name, pod)
        return rv

    async def _watch_once(self, rv: str) -> str:
        """One watch request; returns the resourceVersion to resume from. Raises ``_Gone`` on 410."""
        self.watches += 1
        params = [
            ("watch", "1"),
            ("labelSelector", self._selector),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self._watch_timeout)),
        ]
        if rv:
            params.append(("resourceVersion", rv))
        read_timeout = min(self._watch_timeout, 90) + 30.0
        try:
            async with self._client.stream(pods_path(self._namespace), params, read_timeout=read_timeout) as resp:
                self.denied = None
                buf = b""
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if line.strip():
                            rv = self._event(json.loads(line), rv)
        except KubeApiError as exc:
            if exc.status == 410:
                raise _Gone from exc
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:  # the stream broke: resume from rv
            log.debug("k8s watch stream broke; resuming", error=repr(exc))
            await anyio.sleep(random.uniform(0.05, 0.25))
        return rv

    def _event(self, event: dict[str, Any], rv: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise KubeApiError(f"watch error: {obj.get('message')}", status=obj.get("code"), reason=obj.get("reason"))
        meta = obj.get("metadata") or {}
        new_rv = str(meta.get("resourceVersion") or rv)
        if kind == "BOOKMARK":
            self.bookmarks += 1
            return new_rv
        name = meta.get("name")
        if isinstance(name, str):
            self.observe(name, None if kind == "DELETED" else obj)
        return new_rv
