"""Pod lifecycle simulation for the test server: the kubelet's part, as status updates and watch events.

Pending -> scheduled -> ContainerCreating -> Running/Ready after ``ready_delay``, unless
the image names a fault (see ``server``). Turning Running starts the pod's container
(``container.Container``) with the pod's own command as PID 1. ``activeDeadlineSeconds``
is enforced for real (from ``startTime``; re-armed when patched).

A pod that fails (evicted, OOM-killed, past its deadline) first loses its container (so
running execs die of SIGKILL and report 137, see ``exec_server``), and its status turns
Failed ``status_lag`` seconds later, as a kubelet's status update trails the runtime.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from .container import Container
from .state import PodRuntime, now_rfc3339

__all__ = ["PodLifecycle"]


class PodLifecycle:
    """Mixin for ``KubeTestServer``: needs ``pods``, ``ready_delay``, ``schedule_delay``, ``status_lag``, ``_bump``."""

    pods: dict[tuple[str, str], PodRuntime]
    ready_delay: float
    schedule_delay: float
    status_lag: float

    def _bump(self, rt: PodRuntime, kind: str = "MODIFIED") -> None:
        raise NotImplementedError

    async def evict(
        self,
        name: str,
        namespace: str = "default",
        message: str = "The node was low on resource: memory. Threshold quantity: 100Mi.",
    ) -> None:
        """The kubelet evicts the pod (node pressure by default; pass the kubelet's message for others)."""
        await self._fail_pod(
            self.pods[(namespace, name)],
            reason="Evicted",
            message=message,
            container_reason="ContainerStatusUnknown",
            exit_code=137,
            disruption=True,
        )

    async def oom_kill(self, name: str, namespace: str = "default") -> None:
        """The container's memory cgroup ran out: the kernel kills the whole container (``memory.oom.group``)."""
        await self._fail_pod(
            self.pods[(namespace, name)], reason=None, message=None, container_reason="OOMKilled", exit_code=137
        )

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
        rt.container = Container(rt.obj, rt.root)
        await rt.container.start()
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
        if rt.obj["status"].get("phase") in ("Failed", "Succeeded") or rt.failing:
            return
        rt.failing = True
        if rt.container is not None:
            await rt.container.stop(exit_code)
            await asyncio.sleep(self.status_lag)
        meta = rt.obj["metadata"]
        if self.pods.get((meta["namespace"], meta["name"])) is not rt or meta.get("deletionTimestamp"):
            return  # deleted meanwhile: no status update after the fact
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
