"""Finding pods again: paginated lists by label, and a pod as a ``SandboxInfo`` (with its owner, if local)."""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
from typing import Any
from urllib.parse import quote

from ..._types import SandboxInfo
from .._shared import pid_exists
from ._client import KubeClient
from ._manifest import HOST_ANNOTATION, PID_ANNOTATION, SESSION_LABEL, tags_of
from ._podstate import view

__all__ = ["LIST_LIMIT", "list_pods", "parse_rfc3339", "pods_path", "sandbox_info"]

#: Pods per page; ``continue`` tokens fetch the rest.
LIST_LIMIT = 500


def parse_rfc3339(value: str) -> float:
    """Seconds since the epoch for a Kubernetes timestamp (``2024-01-02T03:04:05Z``, fractions allowed)."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"


async def list_pods(client: KubeClient, namespace: str, label_selector: str) -> tuple[list[dict[str, Any]], str]:
    """Every pod matching ``label_selector``, page by page, and the list's resourceVersion.
    Raises what ``KubeClient.request`` raises (an expired ``continue`` token is a 410 ``KubeApiError``)."""
    pods: list[dict[str, Any]] = []
    cont = ""
    while True:
        params = [("labelSelector", label_selector), ("limit", str(LIST_LIMIT))]
        if cont:
            params.append(("continue", cont))
        doc = await client.request("GET", pods_path(namespace), params=params, what="list pods")
        pods.extend(p for p in doc.get("items") or [] if isinstance(p, dict))
        meta = doc.get("metadata") or {}
        cont = meta.get("continue") or ""
        if not cont:
            return pods, str(meta.get("resourceVersion") or "")


def _owner_alive(annotations: dict[str, Any], pid: int | None) -> bool | None:
    """Whether the driver that made the pod still runs: known only when it ran on this host."""
    if pid is None or annotations.get(HOST_ANNOTATION) != socket.gethostname()[:253]:
        return None
    return pid_exists(pid)


def sandbox_info(pod: dict[str, Any], backend: str) -> SandboxInfo:
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    try:
        created = parse_rfc3339(meta["creationTimestamp"])
    except (KeyError, TypeError, ValueError):
        created = 0.0
    pid: int | None = None
    with contextlib.suppress(KeyError, ValueError):
        pid = int(annotations[PID_ANNOTATION])
    return SandboxInfo(
        sandbox_id=meta["name"],
        tags=tags_of(pod),
        status=view(meta["name"], pod).status,
        created_at=created,
        session_id=labels.get(SESSION_LABEL),
        owner_pid=pid,
        owner_alive=_owner_alive(annotations, pid),
        backend=backend,
    )
