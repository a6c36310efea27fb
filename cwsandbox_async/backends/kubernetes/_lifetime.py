"""A pod's hard TTL after creation: ``activeDeadlineSeconds``, which Kubernetes only lets shrink.

``activeDeadlineSeconds`` counts from ``status.startTime``; on a running pod it may be
set or decreased, never increased or removed (k8s ``ValidatePodUpdate``: "must be less
than or equal to previous value"). Every pod of this backend is created with one (see
``_manifest``), so a lease can only bring the end closer.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..._errors import SandboxNotRunningError, SandboxValidationError
from ._client import KubeApiError, KubeClient
from ._inventory import parse_rfc3339

__all__ = ["set_lifetime"]


async def set_lifetime(
    client: KubeClient, path: str, sandbox_id: str, seconds: float, *, cached: dict[str, Any] | None = None
) -> None:
    """Make the pod at ``path`` end ``seconds`` from now (PATCH ``activeDeadlineSeconds``).

    ``cached`` is the pod as a healthy watch last saw it (its start time and deadline only
    change by this backend's own patches): given, the GET is skipped, so a lease costs one
    call. A later end than the pod already has raises ``SandboxValidationError`` (the pod
    keeps its earlier deadline); a pod that is gone or being deleted raises
    ``SandboxNotRunningError``.
    """
    pod = cached
    if pod is None:
        try:
            pod = await client.request("GET", path, what=f"get pod {sandbox_id}")
        except KubeApiError as exc:
            if exc.status == 404:
                raise SandboxNotRunningError(f"pod {sandbox_id} no longer exists", sandbox_id=sandbox_id) from exc
            raise
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        raise SandboxNotRunningError(f"pod {sandbox_id} is being deleted", sandbox_id=sandbox_id)
    started = (pod.get("status") or {}).get("startTime")
    elapsed = time.time() - parse_rfc3339(started) if started else 0.0
    want = max(1, math.ceil(elapsed + seconds))
    current = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if isinstance(current, int) and want > current:
        raise SandboxValidationError(
            f"cannot extend the lifetime of {sandbox_id}: it ends in {max(0.0, current - elapsed):.0f} s "
            "and Kubernetes only lets activeDeadlineSeconds shrink",
            sandbox_id=sandbox_id,
        )
    try:
        await client.request(
            "PATCH",
            path,
            body={"spec": {"activeDeadlineSeconds": want}},
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
