"""The Kubernetes backend's doctor probes: configuration found, API server reachable, pods listable.

It loads the configuration the backend would use and calls the API server
(version, then a pod list in the namespace). No configuration is ``skip`` unless
Kubernetes was asked for by name; a configured but unreachable cluster is
``warn``, or ``fail`` when asked for by name. The contract is in
``cwsandbox_async.backends.probes``.
"""

from __future__ import annotations

import anyio

from ..._errors import SandboxError
from ..probes import FAIL, OK, SKIP, WARN, DoctorRequest, Section

__all__ = ["probe"]


async def probe(section: Section, request: DoctorRequest) -> None:
    """Config found? API server reachable? Pods listable in the namespace?"""
    from ._backend import KubernetesBackend
    from ._client import KubeClient
    from ._connect import connect
    from ._options import KubernetesOptions

    options, explicit = dict(request.options), request.explicit
    unreachable = FAIL if explicit else WARN
    try:
        opts = KubernetesOptions.from_kwargs(options)
        with anyio.fail_after(request.timeout_seconds):
            cfg = await connect(opts)
    except (SandboxError, TimeoutError) as exc:
        section.add("config", FAIL if explicit else SKIP, str(exc), "load kubeconfig / in-cluster config")
        return
    section.add("config", OK, f"{cfg.source or cfg.server} (namespace {cfg.namespace})", "load the configuration")
    section.facts.update(server=cfg.server, namespace=cfg.namespace)
    client = KubeClient(cfg, opts)
    backend = KubernetesBackend(**{**options, "sweep_on_close": False})
    budget = request.timeout_seconds
    try:
        with anyio.fail_after(budget):
            version = await client.request("GET", "/version", budget=budget, what="get the server version")
        section.add("reachable", OK, f"API server {version.get('gitVersion', '?')}", "GET /version")
        with anyio.fail_after(budget):
            pods = await backend.list()
        section.add("pods listable", OK, f"{len(pods)} sandbox pods in namespace {cfg.namespace}", "list pods by label")
    except (SandboxError, TimeoutError) as exc:
        section.add("reachable", unreachable, f"{type(exc).__name__}: {exc}", "GET /version; list pods")
    finally:
        with request.cleanup():
            await client.aclose()
            await backend.aclose()
