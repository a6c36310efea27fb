"""Helpers for the tests on the real control plane (``tests/cluster``): namespaces, the docs' Role, tokens.

The backend under test never uses the admin certificate: ``Tenant`` applies the
ServiceAccount, Role and RoleBinding of ``docs/kubernetes.md`` (optionally with one verb
taken away) in a fresh namespace, asks a TokenRequest (``kubectl create token``) for a
token, and hands out backend options with that bearer token and the cluster's CA. The
tests' own checks (pods left, processes in a pod) use the admin kubeconfig.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import yaml
from guards import HANG_GUARD_SECONDS

from cwsandbox_async.backends.kubernetes import KubernetesBackend

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs" / "kubernetes.md"
#: Any image name runs the host's read-only view on the test nodes; this one names what the tests need.
IMAGE = "cwsandbox/python:3"


def docs_rbac(namespace: str) -> list[dict[str, Any]]:
    """The ServiceAccount, Role and RoleBinding of docs/kubernetes.md (the block after ``<!-- rbac-role -->``),
    moved to ``namespace``."""
    text = DOCS.read_text()
    match = re.search(r"<!-- rbac-role -->\s*```yaml\n(.*?)```", text, re.S)
    assert match, "docs/kubernetes.md lost its rbac-role block"
    docs = [d for d in yaml.safe_load_all(match.group(1)) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
    return docs


def without(docs: list[dict[str, Any]], resource: str, verb: str) -> list[dict[str, Any]]:
    """``docs`` with ``verb`` on ``resource`` taken out of the Role."""
    out = json.loads(json.dumps(docs))
    role = next(d for d in out if d["kind"] == "Role")
    for rule in role["rules"]:
        if resource in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    return out


class Tenant:
    """A namespace of its own with the docs' Role bound to a ServiceAccount, and a token for it."""

    def __init__(self, cluster: Any, namespace: str, token: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.token = token

    def options(self, **extra: Any) -> dict[str, Any]:
        options: dict[str, Any] = {
            "server": self.cluster.server,
            "ca_file": str(self.cluster.pki.ca),
            "token": self.token,
            "namespace": self.namespace,
            "image": IMAGE,
        }
        options.update(extra)
        return options

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for the ServiceAccount (token, CA, namespace), as a user outside the cluster has."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "sa",
            "clusters": [
                {
                    "name": "c",
                    "cluster": {"server": self.cluster.server, "certificate-authority": str(self.cluster.pki.ca)},
                }
            ],
            "users": [{"name": "sa", "user": {"token": self.token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": self.namespace}}],
        }
        path.write_text(json.dumps(doc))
        return path

    def backend(self, **extra: Any) -> KubernetesBackend:
        return KubernetesBackend(**self.options(**extra))

    async def kubectl(self, *args: str, input: str | None = None) -> str:
        proc = await anyio.to_thread.run_sync(lambda: self.cluster.kubectl(*args, input=input))
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
        return str(proc.stdout)

    async def apply(self, objects: Iterable[dict[str, Any]]) -> None:
        await self.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        )

    async def pods(self) -> list[dict[str, Any]]:
        """Every pod in the namespace, as the admin sees it."""
        items: list[dict[str, Any]] = json.loads(await self.kubectl("-n", self.namespace, "get", "pods", "-o", "json"))[
            "items"
        ]
        return items

    async def wait_no_pods(self, within: float = HANG_GUARD_SECONDS) -> None:
        """Until the namespace holds no pod at all (a deleted pod stays until its node confirms)."""
        left: list[str] = []
        with anyio.move_on_after(within):
            while True:
                left = [p["metadata"]["name"] for p in await self.pods()]
                if not left:
                    return
                await anyio.sleep(0.5)
        raise AssertionError(f"pods left in {self.namespace}: {left}")

    async def processes(self, pod: str) -> list[str]:
        """Command lines of the processes in the pod's main container besides PID 1 (from the node)."""
        procs = await anyio.to_thread.run_sync(lambda: self.cluster.pod_processes(self.namespace, pod))
        return [str(p.get("cmdline", "")) for p in procs.get("main", [])]


@asynccontextmanager
async def tenant(
    cluster: Any,
    *,
    labels: dict[str, str] | None = None,
    rbac: Callable[[str], list[dict[str, Any]]] = docs_rbac,
    extra: Iterable[dict[str, Any]] = (),
) -> AsyncIterator[Tenant]:
    """A fresh namespace (``labels``), ``rbac(namespace)`` (the docs' ServiceAccount, Role and binding) and
    ``extra`` objects in it, a ServiceAccount token; the namespace is deleted afterwards."""
    ns = f"t-{uuid.uuid4().hex[:10]}"
    t = Tenant(cluster, ns, "")
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels or {}}}
    await t.apply([namespace])
    try:
        await t.apply([*rbac(ns), *extra])
        t.token = (await t.kubectl("-n", ns, "create", "token", "cwsandbox", "--duration=2h")).strip()
        yield t
    finally:
        await t.kubectl("delete", "namespace", ns, "--wait=false")
