"""The pod for one sandbox: an idle, hardened main container, labelled so it can always be found again.

Labels (all selectable, all valid label values whatever the tag):

- ``app.kubernetes.io/managed-by: cwsandbox-async`` on every pod this library makes;
- ``cwsandbox.io/driver: <id>``, one per backend instance (its shared watch selects on it);
- ``cwsandbox.io/session: <session id>``;
- ``tag.cwsandbox.io/<sha256(tag)[:20]>: <tag, sanitised>`` per tag. The exact tags are kept in
  the ``cwsandbox.io/tags`` annotation (JSON), which ``list`` reads back.

The spec passes the Pod Security Standard *restricted*: non-root (``runAsUser`` 65532 by
default), no privilege escalation, all capabilities dropped, RuntimeDefault seccomp,
no service account token, no service links, ``restartPolicy: Never``, a short
termination grace (the idle shell exits on SIGTERM), and ``activeDeadlineSeconds`` as a
hard TTL from ``max_lifetime_seconds``, or ``default_lifetime_seconds`` when that is None:
a pod always ends by itself, even when its driver is SIGKILLed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
from collections.abc import Sequence
from typing import Any

from ..._errors import SandboxValidationError
from ..._types import SandboxSpec
from ._options import KubernetesOptions
from ._podstate import MAIN_CONTAINER

__all__ = [
    "DRIVER_LABEL",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "SESSION_LABEL",
    "TAGS_ANNOTATION",
    "build_pod",
    "label_value",
    "selector",
    "tag_key",
    "tag_selector",
    "tags_of",
]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "cwsandbox-async"
DRIVER_LABEL = "cwsandbox.io/driver"
SESSION_LABEL = "cwsandbox.io/session"
NETWORK_LABEL = "cwsandbox.io/network"
TAG_PREFIX = "tag.cwsandbox.io/"
TAGS_ANNOTATION = "cwsandbox.io/tags"
HOST_ANNOTATION = "cwsandbox.io/driver-host"
PID_ANNOTATION = "cwsandbox.io/driver-pid"

#: PID 1 of the main container: idle until SIGTERM, then exit at once (no 30 s grace wait).
IDLE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_value(text: str) -> str:
    """``text`` if it is a valid label value, else a readable sanitised form with a hash suffix."""
    if len(text) <= 63 and _VALUE_RE.match(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    body = re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:52].strip("-_.")
    return f"{body}-{digest}" if body else f"h-{digest}"


def tag_key(tag: str) -> str:
    return TAG_PREFIX + hashlib.sha256(tag.encode()).hexdigest()[:20]


def tag_selector(tags: Sequence[str]) -> list[str]:
    return [f"{tag_key(t)}={label_value(t)}" for t in tags]


def selector(*parts: str) -> str:
    return ",".join(p for p in parts if p)


def tags_of(pod: dict[str, Any]) -> tuple[str, ...]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(TAGS_ANNOTATION)
    try:
        tags = json.loads(raw) if raw else []
    except ValueError:
        tags = []
    return tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else ()


def _mib(value: float) -> str:
    return f"{math.ceil(value)}Mi"


def _resources(spec: SandboxSpec) -> dict[str, Any]:
    r = spec.defaults.resources
    limits: dict[str, str] = {}
    if r.cpu is not None:
        limits["cpu"] = f"{max(1, round(r.cpu * 1000))}m"
    if r.memory_mib is not None:
        limits["memory"] = _mib(r.memory_mib)
    return {"limits": dict(limits), "requests": dict(limits)} if limits else {}


def _volumes(spec: SandboxSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    r, workdir = spec.defaults.resources, spec.defaults.working_dir
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for name, path, size in (("tmp", "/tmp", r.tmp_mib), ("workspace", workdir, r.workspace_mib)):
        if any(m["mountPath"] == path for m in mounts):
            continue
        empty: dict[str, Any] = {"sizeLimit": _mib(size)} if size is not None else {}
        volumes.append({"name": name, "emptyDir": empty})
        mounts.append({"name": name, "mountPath": path})
    return volumes, mounts


def build_pod(spec: SandboxSpec, opts: KubernetesOptions, *, namespace: str, driver: str) -> dict[str, Any]:
    """The Pod manifest for ``spec``. Raises ``SandboxValidationError`` for an id that is not a pod name
    or a sandbox without an image."""
    name, d = spec.sandbox_id, spec.defaults
    if len(name) > 63 or not _NAME_RE.match(name):
        raise SandboxValidationError(f"sandbox id {name!r} is not a valid pod name (DNS label, at most 63 chars)")
    image = d.image or opts.image
    if not image:
        raise SandboxValidationError("the kubernetes backend needs an image: set SandboxDefaults.image or image=...")
    labels = {
        **opts.labels,
        MANAGED_BY_LABEL: MANAGED_BY,
        DRIVER_LABEL: driver,
        SESSION_LABEL: label_value(spec.session_id),
        NETWORK_LABEL: "egress" if d.network else "none",
    }
    for tag in d.tags:
        labels[tag_key(tag)] = label_value(tag)
    annotations = {
        **opts.annotations,
        TAGS_ANNOTATION: json.dumps(list(d.tags)),
        HOST_ANNOTATION: socket.gethostname()[:253],
        PID_ANNOTATION: str(os.getpid()),
    }
    volumes, mounts = _volumes(spec)
    container: dict[str, Any] = {
        "name": MAIN_CONTAINER,
        "image": image,
        "command": ["/bin/sh", "-c", IDLE_SCRIPT],
        "workingDir": d.working_dir,
        "env": [{"name": k, "value": v} for k, v in d.env.items()],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": opts.read_only_root_filesystem,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
    }
    if opts.image_pull_policy:
        container["imagePullPolicy"] = opts.image_pull_policy
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": opts.termination_grace_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": opts.run_as_user,
            "runAsGroup": opts.run_as_group,
            "fsGroup": opts.run_as_group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    lifetime = d.max_lifetime_seconds if d.max_lifetime_seconds is not None else opts.default_lifetime_seconds
    pod_spec["activeDeadlineSeconds"] = max(1, math.ceil(lifetime))
    if opts.runtime_class_name:
        pod_spec["runtimeClassName"] = opts.runtime_class_name
    if opts.host_users is not None:
        pod_spec["hostUsers"] = opts.host_users
    if opts.node_selector:
        pod_spec["nodeSelector"] = dict(opts.node_selector)
    if opts.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in opts.tolerations]
    if opts.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": pod_spec,
    }
