"""Creating a pod through admission: what a refusal means, and the one refusal that clears by itself.

kube-apiserver refuses a pod create for reasons that belong to different people:

- **400** ``strict decoding error: unknown field ...`` (the backend sends
  ``fieldValidation=Strict``): a field the caller passed (``tolerations``...) is misspelled:
  ``SandboxValidationError``;
- **400/422** any other invalid spec: the caller's (``SandboxCreationError``, not infrastructure);
- **403** from RBAC (``cannot create resource "pods"``), ResourceQuota (``exceeded quota``),
  LimitRange, Pod Security (``violates PodSecurity``) or a validating admission policy: the
  caller's cluster configuration, with the server's message (which names the permission or
  the limit) and a ``reason`` saying which;
- **403** ``error looking up service account <ns>/default: serviceaccount "default" not found``:
  a namespace seconds old whose ``default`` ServiceAccount the controller-manager has not made
  yet (kubernetes#66689), and **403** ``status unknown for quota``: a ResourceQuota the quota
  controller has not counted yet. ``create_pod`` retries both until the create deadline; past
  it they are the platform's (``infrastructure=True``: its controllers did not catch up).
"""

from __future__ import annotations

import random
import time
from typing import Any

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_before_delay

from ..._errors import SandboxCreationError, SandboxError, SandboxValidationError
from ..._log import log
from ._client import KubeApiError, KubeClient

__all__ = ["create_pod", "not_yet", "refusal"]

#: (substring of a 403 message, reason reported) in the order they are checked.
_FORBIDDEN = (
    ("exceeded quota", "ExceededQuota"),
    ("violates podsecurity", "PodSecurity"),
    ("cannot create resource", "RBAC"),
    ("usage per", "LimitRange"),
    ("limitrange", "LimitRange"),
)


def not_yet(exc: KubeApiError) -> str | None:
    """Which controller a transient 403 waits for: ``ServiceAccountMissing`` (``serviceaccount "x" not
    found``), ``QuotaNotCounted`` (``status unknown for quota``); None for any other error."""
    if exc.status != 403:
        return None
    message = exc.message.lower()
    if "serviceaccount" in message and "not found" in message:
        return "ServiceAccountMissing"
    if "status unknown for quota" in message:
        return "QuotaNotCounted"
    return None


def refusal(sid: str, exc: KubeApiError) -> SandboxError:
    """The library's error for a create the API server refused with 400, 403 or 422."""
    message = exc.message
    if exc.status == 400 and "unknown field" in message:
        return SandboxValidationError(f"pod {sid} has a field Kubernetes does not know: {message}", sandbox_id=sid)
    if (waited := not_yet(exc)) is not None:  # still so at the deadline: the platform's controllers lag
        return SandboxCreationError(
            f"the API server still refuses pod {sid} at the create deadline: {message}", sandbox_id=sid, reason=waited
        )
    reason = exc.reason or str(exc.status)
    if exc.status == 403:
        lowered = message.lower()
        reason = next((r for needle, r in _FORBIDDEN if needle in lowered), "Forbidden")
    return SandboxCreationError(
        f"the API server refused pod {sid}: {message}", sandbox_id=sid, reason=reason, infrastructure=False
    )


async def create_pod(client: KubeClient, path: str, manifest: dict[str, Any], sid: str, *, deadline: float) -> Any:
    """POST ``manifest``; a 403 that waits for a controller (``not_yet``) is retried (jittered, capped at 1 s)
    until the monotonic ``deadline``. Raises ``KubeApiError`` as the client does (the caller classifies it)."""

    def wait(state: RetryCallState) -> float:
        return float(min(1.0, 0.05 * 2 ** (state.attempt_number - 1)) * random.uniform(0.5, 1.0))

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        waited = not_yet(exc) if isinstance(exc, KubeApiError) else None
        log.debug("k8s create waits for a controller", sandbox_id=sid, waits_for=waited, attempt=state.attempt_number)

    retrying = AsyncRetrying(
        stop=stop_before_delay(max(0.0, deadline - time.monotonic())),
        wait=wait,
        retry=retry_if_exception(lambda e: isinstance(e, KubeApiError) and not_yet(e) is not None),
        sleep=anyio.sleep,
        reraise=True,
        before_sleep=before_sleep,
    )
    async for attempt in retrying:
        with attempt:
            budget = max(0.1, min(2 * client.opts.request_timeout_seconds, deadline - time.monotonic()))
            return await client.request(
                "POST", path, body=manifest, budget=budget, what=f"create pod {sid}", forbidden_is_unavailable=False
            )
    raise AssertionError("unreachable")  # pragma: no cover
