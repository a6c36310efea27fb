"""The test server's data: recorded requests, injected faults, pods at runtime, Status bodies, merge patches."""

from __future__ import annotations

import asyncio
import copy
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from aiohttp import web

from .container import Container

__all__ = ["Fault", "PodRuntime", "Recorded", "merge_patch", "now_rfc3339", "status_body", "status_response"]


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

    ``kind``: ``status`` (reply ``status`` with a Status body carrying ``message``, or ``text`` as a
    plain-text body; ``retry_after`` header),
    ``drop`` (close the connection without replying), ``drop_after`` (handle the request, then
    close without replying), ``delay`` (sleep ``seconds`` first, or wait for ``gate``), ``slow`` (sleep ``seconds``
    while counted in flight),
    ``watch_410`` (a watch request gets HTTP 410), ``exec_no_status`` (the command runs, the
    socket closes without a status), ``exec_status`` (reply ``status_json`` instead of the
    real status), ``exec_drop`` (close the socket right after the upgrade). Faults of the
    container itself are pod methods on the server (``evict``, ``oom_kill``) and its
    ``on_container_death`` setting.
    """

    kind: str
    method: str | None = None
    path: str | None = None
    status: int = 500
    retry_after: float | None = None
    seconds: float = 0.0
    gate: anyio.Event | None = None  # ``delay``: wait until it is set instead of sleeping ``seconds``
    times: int = 1
    status_json: dict[str, Any] | None = None
    query: str | None = None  # a regex the (decoded) query string must match, e.g. an exec's command
    message: str | None = None  # the Status message (default ``injected <status>``)
    text: str | None = None  # a plain-text body instead of a Status (kube-apiserver's max-in-flight 429)
    hits: int = 0

    def matches(self, method: str, path: str, kinds: tuple[str, ...], query: str = "") -> bool:
        return (
            self.times > 0
            and self.kind in kinds
            and (self.method is None or self.method == method)
            and (self.path is None or re.search(self.path, path) is not None)
            and (self.query is None or re.search(self.query, query) is not None)
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
    container: Container | None = None
    start_monotonic: float | None = None
    failing: bool = False

    @property
    def execs(self) -> set[Any]:
        """The exec processes still alive in this pod (attached or not)."""
        return self.container.execs if self.container is not None else set()
