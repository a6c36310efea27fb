"""Pod validation for the test server: the official OpenAPI models plus the API server's own rules.

1. ``kubernetes.client.V1Pod.model_validate``: the generated models (pydantic, ``extra="forbid"``,
   strict types) reject unknown fields, wrong types and missing required fields.
2. Semantic checks the models do not encode (from k8s pkg/apis/core/validation): names,
   label keys/values, enums, quantities, volume references, unique mount paths.
3. Pod Security Admission, profile *restricted* (pod-security-standards): what a namespace
   labelled ``pod-security.kubernetes.io/enforce=restricted`` demands.
"""

from __future__ import annotations

import re
from typing import Any

from kubernetes import client as k8s

__all__ = ["drop_unknown_fields", "psa_restricted_violations", "unknown_fields", "validate_pod"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

ENUMS = {
    "restartPolicy": {"Always", "OnFailure", "Never"},
    "imagePullPolicy": {"Always", "IfNotPresent", "Never"},
    "seccompProfile.type": {"RuntimeDefault", "Localhost", "Unconfined"},
    "toleration.operator": {"Exists", "Equal"},
    "toleration.effect": {"NoSchedule", "PreferNoSchedule", "NoExecute", ""},
}


def _label_key(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"label key {key!r}: prefix must be a DNS subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return f"label key {key!r}: name must be 1-63 alphanumeric, '-', '_' or '.' characters"
    return None


def _semantic(pod: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if pod.get("apiVersion") != "v1" or pod.get("kind") != "Pod":
        errors.append("apiVersion/kind must be v1/Pod")
    name = meta.get("name", "")
    if not name or len(name) > 63 or not _DNS_SUBDOMAIN.match(name):
        errors.append(f"metadata.name {name!r}: must be a DNS subdomain (63 chars for a hostname)")
    for key, value in (meta.get("labels") or {}).items():
        if err := _label_key(key):
            errors.append(err)
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(f"label value {value!r} for {key!r} is invalid")
    total = sum(len(k) + len(v) for k, v in (meta.get("annotations") or {}).items())
    if total > 256 * 1024:
        errors.append("metadata.annotations: must have at most 262144 bytes")
    if spec.get("restartPolicy", "Always") not in ENUMS["restartPolicy"]:
        errors.append(f"spec.restartPolicy {spec.get('restartPolicy')!r} unsupported")
    ads = spec.get("activeDeadlineSeconds")
    if ads is not None and ads < 1:
        errors.append("spec.activeDeadlineSeconds must be >= 1")
    volumes = {v["name"] for v in spec.get("volumes") or []}
    if len(volumes) != len(spec.get("volumes") or []):
        errors.append("spec.volumes: duplicate name")
    for v in volumes:
        if not _DNS_LABEL.match(v):
            errors.append(f"volume name {v!r} must be a DNS label")
    for seccomp in _seccomps(spec):
        if seccomp.get("type") not in ENUMS["seccompProfile.type"]:
            errors.append(f"seccompProfile.type {seccomp.get('type')!r} unsupported")
    for t in spec.get("tolerations") or []:
        if t.get("operator", "Equal") not in ENUMS["toleration.operator"]:
            errors.append(f"toleration operator {t.get('operator')!r} unsupported")
        if t.get("effect", "") not in ENUMS["toleration.effect"]:
            errors.append(f"toleration effect {t.get('effect')!r} unsupported")
    names: set[str] = set()
    for c in spec.get("containers") or []:
        cname = c.get("name", "")
        if not _DNS_LABEL.match(cname) or cname in names:
            errors.append(f"container name {cname!r} must be a unique DNS label")
        names.add(cname)
        if c.get("imagePullPolicy", "IfNotPresent") not in ENUMS["imagePullPolicy"]:
            errors.append(f"imagePullPolicy {c.get('imagePullPolicy')!r} unsupported")
        for e in c.get("env") or []:
            if not _ENV_NAME.match(e.get("name", "")):
                errors.append(f"env name {e.get('name')!r} invalid")
        for kind in ("limits", "requests"):
            for res, qty in ((c.get("resources") or {}).get(kind) or {}).items():
                if not _QUANTITY.match(qty):
                    errors.append(f"resources.{kind}.{res} {qty!r} is not a quantity")
        paths = [m["mountPath"] for m in c.get("volumeMounts") or []]
        if len(paths) != len(set(paths)):
            errors.append(f"container {cname}: duplicate mountPath")
        for m in c.get("volumeMounts") or []:
            if m["name"] not in volumes:
                errors.append(f"volumeMount {m['name']!r} names no volume")
            if not m["mountPath"].startswith("/"):
                errors.append(f"mountPath {m['mountPath']!r} must be absolute")
    if not spec.get("containers"):
        errors.append("spec.containers: at least one container is required")
    return errors


def _seccomps(spec: dict[str, Any]) -> list[dict[str, Any]]:
    out = [(spec.get("securityContext") or {}).get("seccompProfile")]
    out += [(c.get("securityContext") or {}).get("seccompProfile") for c in spec.get("containers") or []]
    return [s for s in out if s is not None]


def psa_restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What Pod Security Admission *restricted* would reject (a subset: the checks that apply to our pods)."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    out: list[str] = []
    for c in spec.get("containers") or []:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f'allowPrivilegeEscalation != false (container "{c["name"]}")')
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            out.append(f'unrestricted capabilities (container "{c["name"]}" must drop ALL)')
        if set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f'unrestricted capabilities (container "{c["name"]}" adds)')
        if sc.get("privileged"):
            out.append(f'privileged (container "{c["name"]}")')
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
            out.append(f'runAsNonRoot != true (container "{c["name"]}")')
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f'runAsUser=0 (container "{c["name"]}")')
        seccomp = sc.get("seccompProfile") or psc.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f'seccompProfile (container "{c["name"]}" must set RuntimeDefault or Localhost)')
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= {"emptyDir", "configMap", "secret", "projected", "downwardAPI", "persistentVolumeClaim"}:
            out.append(f"restricted volume types (volume {v['name']!r})")
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        out.append("host namespaces")
    return out


def validate_pod(pod: dict[str, Any]) -> list[str]:
    """Every reason the API server would refuse ``pod`` as invalid (422); empty when it is valid."""
    try:
        k8s.V1Pod.model_validate(pod)
    except Exception as exc:  # pydantic.ValidationError: report it like the API server's field errors
        return [f"openapi: {line}" for line in str(exc).splitlines()[1:] if line and not line.startswith(" ")] or [
            str(exc)
        ]
    return _semantic(pod)


def unknown_fields(pod: dict[str, Any]) -> list[tuple[str | int, ...]]:
    """Paths of the fields the Pod schema does not have (what ``fieldValidation`` is about)."""
    try:
        k8s.V1Pod.model_validate(pod)
    except Exception as exc:
        errors = getattr(exc, "errors", None)
        if errors is None:
            raise
        return [tuple(e["loc"]) for e in errors() if e["type"] == "extra_forbidden"]
    return []


def field_path(loc: tuple[str | int, ...]) -> str:
    """A field path as kube-apiserver prints it: ``spec.tolerations[0].operater``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def drop_unknown_fields(pod: dict[str, Any], paths: list[tuple[str | int, ...]]) -> None:
    """Remove ``paths`` from ``pod`` in place, as the server's decoder does in Warn and Ignore modes."""
    for loc in paths:
        node: Any = pod
        for part in loc[:-1]:
            node = node[part]
        node.pop(loc[-1], None)
