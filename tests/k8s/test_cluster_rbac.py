"""Least privilege on the real control plane: the docs' Role is enough, and each of its verbs is needed.

With one verb taken out of the Role, the call that needs it fails with an error that names
the verb and the resource (the API server's words) and is not infrastructure.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxError
from cwsandbox_async.testing.contract import make_request, make_spec

from .real import Tenant, docs_rbac, tenant, without


async def _admin_pod(t: Tenant, tag: str) -> str:
    """A pod of the library's kind made by a full-permission backend (the admin), for the scenario to act on."""
    admin = t.backend(token=None, kubeconfig=str(t.cluster.kubeconfig), server=None, ca_file=None, sweep_on_close=False)
    spec = make_spec(tag)
    try:
        await admin.create(spec)
    finally:
        await admin.aclose()
    return spec.sandbox_id


async def _scenario(t: Tenant, resource: str, verb: str) -> None:
    """The backend call that needs ``verb`` on ``resource``; raises what the backend raises."""
    backend = t.backend()
    try:
        if (resource, verb) in (("pods", "create"), ("pods", "list"), ("pods", "watch")):
            await backend.create(make_spec("rbac", create_timeout_seconds=60))
        elif resource == "pods/exec":
            sid = await _admin_pod(t, "rbac")
            await backend.exec(sid, make_request("true"))
        elif verb == "get":
            sid = await _admin_pod(t, "rbac")
            await backend.status(sid)  # no watch yet: a GET
        elif verb == "patch":
            sid = await _admin_pod(t, "rbac")
            await backend.set_lifetime(sid, 60)
        elif verb == "delete":
            sid = await _admin_pod(t, "rbac")
            await backend.destroy(sid)
        elif verb == "deletecollection":
            await backend.sweep(["rbac"])
        else:  # pragma: no cover
            raise AssertionError((resource, verb))
    finally:
        await backend.aclose()


VERBS = [("pods", v) for v in ("create", "get", "list", "watch", "patch", "delete", "deletecollection")]
VERBS += [("pods/exec", "get"), ("pods/exec", "create")]


@pytest.mark.parametrize(("resource", "verb"), VERBS, ids=[f"{r}-{v}" for r, v in VERBS])
async def test_each_verb_of_the_role_is_needed_and_its_absence_is_named(
    real_cluster: Any, resource: str, verb: str
) -> None:
    async with tenant(real_cluster, rbac=lambda ns: without(docs_rbac(ns), resource, verb)) as t:
        with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(SandboxError) as info:
            await _scenario(t, resource, verb)
        message = str(info.value)
        if resource == "pods/exec":
            assert "pods/exec" in message and "get and create" in message, message
        else:
            assert re.search(rf'cannot {verb} resource "pods"', message), message
        assert not info.value.infrastructure, message
        for p in await t.pods():
            await t.kubectl("-n", t.namespace, "delete", "pod", p["metadata"]["name"], "--wait=false")
        await t.wait_no_pods()


async def test_the_docs_role_runs_a_whole_lifecycle(real_cluster: Any) -> None:
    async with tenant(real_cluster) as t:
        backend = t.backend()
        try:
            spec = make_spec("rbac-ok")
            await backend.create(spec)
            await backend.set_lifetime(spec.sandbox_id, 600)
            assert (await backend.exec(spec.sandbox_id, make_request("echo", "ok"))).stdout == b"ok\n"
            await backend.write_file(spec.sandbox_id, "/workspace/f", b"x")
            assert await backend.read_file(spec.sandbox_id, "/workspace/f", 10) == b"x"
            assert [i.sandbox_id for i in await backend.list(["rbac-ok"])] == [spec.sandbox_id]
            await backend.destroy(spec.sandbox_id)
            assert await backend.sweep(["rbac-ok"]) == []
        finally:
            await backend.aclose()
        await t.wait_no_pods()
