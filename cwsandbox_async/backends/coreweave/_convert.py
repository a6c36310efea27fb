"""The library's specs and results <-> the service's protobuf messages.

Tags: the service's tags carry the user's tags plus three of this library's
(``MANAGED_TAG``, one naming the backend instance that created the sandbox, one naming
the library's sandbox id), so ``ListSandboxes`` by tag finds a sandbox by its library
id, by its creator and by the user's tags, also from another process. Annotations
repeat the ids and the session for people reading the service's console.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from typing import Any

from ..._types import SandboxInfo, SandboxSpec, SandboxStatus
from .._shared import pid_exists
from ._exec import KEEPALIVE
from ._options import CoreWeaveOptions

__all__ = [
    "MANAGED_TAG",
    "create_request",
    "driver_tag",
    "id_tag",
    "library_id",
    "sandbox_info",
    "status_of",
    "user_tags",
]

MANAGED_TAG = "cwsandbox-async"
_DRIVER_PREFIX = "cwsandbox-async-driver-"
_ID_PREFIX = "cwsandbox-async-id-"
ANNOTATION_PREFIX = "cwsandbox-async/"


def driver_tag(driver_id: str) -> str:
    return _DRIVER_PREFIX + driver_id


def id_tag(sandbox_id: str) -> str:
    return _ID_PREFIX + sandbox_id


def user_tags(tags: Any, hidden: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The user's tags of a sandbox: without the library's own and the backend's ``hidden`` (scope) tags."""
    return tuple(
        t for t in tags if t != MANAGED_TAG and t not in hidden and not t.startswith((_DRIVER_PREFIX, _ID_PREFIX))
    )


def library_id(sandbox: Any) -> str:
    """The library's id of a service sandbox: its id tag, else the service's own id."""
    for tag in sandbox.spec.tags:
        if tag.startswith(_ID_PREFIX):
            return str(tag[len(_ID_PREFIX) :])
    return str(sandbox.sandbox_id)


def status_of(state: int) -> SandboxStatus:
    """The library's status for a service ``State`` (PAUSED counts as running, as in the SDK)."""
    from cwsandbox._proto import sandbox_pb2 as pb

    if state in (pb.STATE_RUNNING, pb.STATE_PAUSED):
        return SandboxStatus.RUNNING
    if state in (pb.STATE_CREATING, pb.STATE_PENDING, pb.STATE_PREPARING):
        return SandboxStatus.CREATING
    if state == pb.STATE_TERMINATING:
        return SandboxStatus.TERMINATING
    if state == pb.STATE_FAILED:
        return SandboxStatus.FAILED
    return SandboxStatus.COMPLETED  # COMPLETED, TERMINATED (legacy), UNSPECIFIED (as the SDK reads it)


def sandbox_info(sandbox: Any, backend: str, hidden: tuple[str, ...] = ()) -> SandboxInfo:
    ann = sandbox.spec.annotations
    created = sandbox.status.create_time
    pid = ann.get(ANNOTATION_PREFIX + "owner-pid", "")
    host = ann.get(ANNOTATION_PREFIX + "owner-host", "")
    alive: bool | None = None
    if pid.isdigit() and host == socket.gethostname():
        alive = pid_exists(int(pid))
    return SandboxInfo(
        sandbox_id=library_id(sandbox),
        tags=user_tags(sandbox.spec.tags, hidden),
        status=status_of(sandbox.status.state),
        created_at=created.seconds + created.nanos / 1e9,
        session_id=ann.get(ANNOTATION_PREFIX + "session-id") or None,
        owner_pid=int(pid) if pid.isdigit() else None,
        owner_alive=alive,
        backend=backend,
    )

    return True


def _quantity_cpu(cores: float) -> str:
    return f"{max(1, round(cores * 1000))}m"


def create_request(spec: SandboxSpec, options: CoreWeaveOptions, driver_id: str, scope: tuple[str, ...] = ()) -> Any:
    """The ``CreateSandboxRequest`` for ``spec``, with a fresh idempotency key (``request_id``).

    ``Resources.cpu``/``memory_mib`` become equal requests and limits, ``workspace_mib``
    a scratch volume at the working directory, ``max_lifetime_seconds`` the service's
    TTL, ``network=False`` denied egress and ingress.
    """
    from cwsandbox._proto import sandbox_pb2 as pb

    d = spec.defaults
    res = d.resources
    container = pb.Container(
        name="main",
        image=d.image or options.image,
        command=KEEPALIVE[0],
        args=list(KEEPALIVE[1:]),
        environment_variables=dict(d.env),
    )
    limits = pb.Resources()
    if res.cpu:
        limits.cpu = _quantity_cpu(res.cpu)
    if res.memory_mib:
        limits.memory = f"{res.memory_mib}Mi"
    if res.cpu or res.memory_mib:
        container.resource_requirements.CopyFrom(pb.ResourceRequirements(requests=limits, limits=limits))
    volumes = []
    if res.workspace_mib and d.working_dir != "/":
        volumes.append(pb.SandboxVolume(name="workspace", scratch=pb.ScratchVolume(size=f"{res.workspace_mib}Mi")))
        container.volume_mounts.append(pb.VolumeMount(volume="workspace", mount_path=d.working_dir))
    annotations = {
        **options.annotations,
        ANNOTATION_PREFIX + "sandbox-id": spec.sandbox_id,
        ANNOTATION_PREFIX + "session-id": spec.session_id,
        ANNOTATION_PREFIX + "owner-pid": str(os.getpid()),
        ANNOTATION_PREFIX + "owner-host": socket.gethostname(),
    }
    tags = [
        *d.tags,
        *(t for t in scope if t not in d.tags),
        MANAGED_TAG,
        driver_tag(driver_id),
        id_tag(spec.sandbox_id),
    ]
    sandbox_spec = pb.SandboxSpec(containers=[container], volumes=volumes, tags=tags, annotations=annotations)
    if d.max_lifetime_seconds is not None:
        sandbox_spec.max_lifetime_seconds = max(1, math.ceil(d.max_lifetime_seconds))
    if not d.network:
        sandbox_spec.network.CopyFrom(pb.NetworkOptions(deny_egress=True, deny_ingress=True))
    if options.runtime_class:
        sandbox_spec.runtime_class = options.runtime_class
    return pb.CreateSandboxRequest(sandbox=pb.Sandbox(spec=sandbox_spec), request_id=str(uuid.uuid4()))
