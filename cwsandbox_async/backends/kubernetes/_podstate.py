"""Reading a Pod object: is it ready, still starting, or dead (and why)?

Fatal signals (kubernetes.md section 2): image pull errors, container config errors,
a terminated main container (OOMKilled, Error), phase Failed (Evicted,
DeadlineExceeded) or Succeeded, and deletion. ``Unschedulable`` is reported separately
because it may clear when an autoscaler adds nodes; the waiter decides how long to
tolerate it.

Whose fault a death is (``PodView.infrastructure``): the program's when it caused it
(its container was ``OOMKilled``, or the kubelet evicted the pod because the program
filled an ``emptyDir`` or the container's ephemeral storage past its limit), the
caller's when its own lifetime fired (``DeadlineExceeded``, or the backend deleted the
pod); the platform's otherwise (node pressure, preemption, a pod deleted by someone else).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..._errors import SandboxCreationError, SandboxNotRunningError
from ..._types import SandboxStatus

__all__ = ["MAIN_CONTAINER", "PodView", "view"]

#: Eviction messages of the kubelet when the pod's *own* storage use passed its own limit
#: (k8s pkg/kubelet/eviction/helpers.go: emptyDir/container ephemeral-storage/pod limits).
_SELF_INFLICTED_EVICTION = ("exceeds the limit", "ephemeral local storage usage exceeds")

MAIN_CONTAINER = "main"

#: containerStatuses[].state.waiting.reason values that will not resolve on their own.
FATAL_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "ImageInspectError",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)


@dataclass(frozen=True)
class PodView:
    """What the backend needs to know about one pod."""

    name: str
    exists: bool
    phase: str = ""
    ready: bool = False
    terminating: bool = False
    failure: str | None = None  # a reason such as "ImagePullBackOff", "OOMKilled", "Evicted"
    message: str = ""
    unschedulable: str | None = None  # the scheduler's message while the pod cannot be placed
    container_reason: str | None = None  # the main container's terminated reason ("OOMKilled", "Error")

    @property
    def oom_killed(self) -> bool:
        """The kernel killed the main container for its memory use (the program's doing)."""
        return self.container_reason == "OOMKilled" or self.failure == "OOMKilled"

    @property
    def infrastructure(self) -> bool:
        """Whether the pod's death is the platform's fault (see the module docstring)."""
        if self.oom_killed or self.failure == "DeadlineExceeded":
            return False
        return not (self.failure == "Evicted" and any(m in self.message for m in _SELF_INFLICTED_EVICTION))

    @property
    def status(self) -> SandboxStatus:
        if not self.exists or self.terminating:
            return SandboxStatus.FAILED
        if self.failure is not None:
            return SandboxStatus.COMPLETED if self.phase == "Succeeded" else SandboxStatus.FAILED
        return SandboxStatus.RUNNING if self.ready else SandboxStatus.CREATING

    @property
    def dead(self) -> bool:
        return not self.exists or self.terminating or self.failure is not None

    def describe(self) -> str:
        if not self.exists:
            return f"pod {self.name} no longer exists"
        if self.terminating:
            return f"pod {self.name} is being deleted"
        if self.failure is not None:
            return f"pod {self.name} failed: {self.failure}" + (f": {self.message}" if self.message else "")
        if self.unschedulable is not None:
            return f"pod {self.name} cannot be scheduled: {self.unschedulable}"
        return f"pod {self.name} is {self.phase or 'Pending'}" + (f" ({self.message})" if self.message else "")

    def creation_error(self) -> SandboxCreationError:
        reason = self.failure or ("Unschedulable" if self.unschedulable is not None else "NotFound")
        if not self.exists:
            reason = "Deleted"
        elif self.terminating:
            reason = "Terminating"
        return SandboxCreationError(self.describe(), sandbox_id=self.name, reason=reason)

    def not_running_error(self) -> SandboxNotRunningError:
        return SandboxNotRunningError(self.describe(), sandbox_id=self.name, infrastructure=self.infrastructure)


def _container(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(cs, dict) and cs.get("name") == MAIN_CONTAINER:
            return cs
    return None


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == kind:
            return cond
    return None


def view(name: str, pod: dict[str, Any] | None) -> PodView:
    """Classify ``pod`` (None when it does not exist)."""
    if pod is None:
        return PodView(name=name, exists=False)
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    if meta.get("deletionTimestamp"):
        return PodView(name=name, exists=True, phase=phase, terminating=True)
    cs = _container(pod) or {}
    state = cs.get("state") or {}
    terminated = state.get("terminated") or {}
    waiting = state.get("waiting") or {}
    if phase in ("Failed", "Succeeded") or terminated:
        reason = status.get("reason") or terminated.get("reason") or ("Completed" if phase == "Succeeded" else "Failed")
        message = status.get("message") or terminated.get("message") or ""
        if terminated.get("exitCode") is not None and not message:
            message = f"main container exited with code {terminated['exitCode']}"
        return PodView(
            name=name,
            exists=True,
            phase=phase,
            failure=str(reason),
            message=str(message),
            container_reason=str(terminated["reason"]) if terminated.get("reason") else None,
        )
    if waiting.get("reason") in FATAL_WAITING:
        return PodView(
            name=name, exists=True, phase=phase, failure=str(waiting["reason"]), message=str(waiting.get("message", ""))
        )
    ready_cond = _condition(pod, "Ready")
    ready = phase == "Running" and bool(ready_cond and ready_cond.get("status") == "True")
    if ready and cs:
        ready = bool(cs.get("ready", True))
    sched = _condition(pod, "PodScheduled")
    unschedulable = None
    if sched and sched.get("status") == "False" and sched.get("reason") == "Unschedulable":
        unschedulable = str(sched.get("message") or "Unschedulable")
    message = str(waiting.get("reason") or "") if not ready else ""
    return PodView(name=name, exists=True, phase=phase, ready=ready, unschedulable=unschedulable, message=message)
