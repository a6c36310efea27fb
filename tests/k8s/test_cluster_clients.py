"""The official ``kubernetes`` client and kubectl of the build against the real kube-apiserver, with the same
assertions ``test_official_client`` and ``test_kubectl`` make of the test server: where they hold on both,
the test server models the real thing; where they differ, this file says so.

Kept on the test server only: compaction on demand (``test_a_watch_or_continue_from_before_compaction_is_gone``;
the real server compacts etcd every 5 minutes; its 410 inside a 200 stream is checked in ``test_cluster_pods``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import pytest
from guards import HANG_GUARD_SECONDS
from kubernetes import client as k8s
from kubernetes import config, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from cwsandbox_async.testing.contract import make_spec

from .real import IMAGE, Tenant, tenant
from .test_official_client import pod_body, status_of

T = TypeVar("T")
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}  # the test server enforces it everywhere


async def call(fn: Callable[[], T]) -> T:
    with anyio.fail_after(HANG_GUARD_SECONDS):
        return await anyio.to_thread.run_sync(fn)


@pytest.fixture
async def ns(real_cluster: Any) -> AsyncIterator[Tenant]:
    async with tenant(real_cluster, labels=RESTRICTED) as t:
        yield t


@pytest.fixture
async def api(real_cluster: Any) -> AsyncIterator[k8s.CoreV1Api]:
    api_client = config.new_client_from_config(config_file=str(real_cluster.kubeconfig))
    with api_client:
        yield k8s.CoreV1Api(api_client)


async def running(api: k8s.CoreV1Api, ns: str, name: str) -> None:
    with anyio.fail_after(HANG_GUARD_SECONDS):
        while (await call(lambda: api.read_namespaced_pod(name, ns))).status.phase != "Running":  # noqa: ASYNC110
            await anyio.sleep(0.2)


async def test_create_get_conflict_invalid_and_forbidden(ns: Tenant, api: k8s.CoreV1Api) -> None:
    n = ns.namespace
    created = await call(lambda: api.create_namespaced_pod(n, pod_body("p-one", {"app": "a"})))
    assert created.metadata.name == "p-one" and created.metadata.uid and created.metadata.resource_version
    got = await call(lambda: api.read_namespaced_pod("p-one", n))
    assert got.metadata.uid == created.metadata.uid
    # defaults the real server fills in, which the backend reads back
    assert got.spec.dns_policy == "ClusterFirst" and got.spec.scheduler_name == "default-scheduler"
    assert {t.key for t in got.spec.tolerations or []} >= {"node.kubernetes.io/not-ready"}
    with pytest.raises(ApiException) as info:
        await call(lambda: api.create_namespaced_pod(n, pod_body("p-one")))
    assert info.value.status == 409 and status_of(info.value)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as info:
        await call(lambda: api.read_namespaced_pod("p-none", n))
    assert info.value.status == 404 and status_of(info.value)["reason"] == "NotFound"
    with pytest.raises(ApiException) as info:
        await call(lambda: api.create_namespaced_pod(n, pod_body("Not_A_Name")))
    assert info.value.status == 422 and status_of(info.value)["reason"] == "Invalid"
    escalating = pod_body("p-priv")  # (privileged: True is a 422 here: the apiserver runs --allow-privileged=false)
    escalating["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(ApiException) as info:
        await call(lambda: api.create_namespaced_pod(n, escalating))
    assert info.value.status == 403 and "PodSecurity" in status_of(info.value)["message"]
    unknown = await call(
        lambda: api.api_client.rest_client.pool_manager.request("GET", api.api_client.configuration.host + "/apis/x/y")
    )
    # a divergence: for a path outside every API group the real server answers in plain text, not a Status
    assert unknown.status == 404 and unknown.data.startswith(b"404 page not found")
    await call(lambda: api.delete_namespaced_pod("p-one", n, grace_period_seconds=0))
    await ns.wait_no_pods()


async def test_list_with_label_and_field_selectors(ns: Tenant, api: k8s.CoreV1Api) -> None:
    n = ns.namespace
    for name, labels in (("p-a1", {"app": "a", "tier": "x"}), ("p-a2", {"app": "a"}), ("p-b", {"app": "b"})):
        await call(lambda nm=name, lb=labels: api.create_namespaced_pod(n, pod_body(nm, lb)))  # type: ignore[misc]
    names = lambda pods: sorted(p.metadata.name for p in pods.items)  # noqa: E731 - tiny helper
    assert names(await call(lambda: api.list_namespaced_pod(n, label_selector="app=a"))) == ["p-a1", "p-a2"]
    assert names(await call(lambda: api.list_namespaced_pod(n, label_selector="app in (b),!tier"))) == ["p-b"]
    assert names(await call(lambda: api.list_namespaced_pod(n, label_selector="app=a,tier"))) == ["p-a1"]
    await running(api, n, "p-b")
    by_field = await call(lambda: api.list_namespaced_pod(n, field_selector="metadata.name=p-b,status.phase=Running"))
    assert names(by_field) == ["p-b"]
    page = await call(lambda: api.list_namespaced_pod(n, limit=2))
    assert len(page.items) == 2 and page.metadata._continue
    rest = await call(lambda: api.list_namespaced_pod(n, limit=2, _continue=page.metadata._continue))
    assert len(rest.items) == 1 and not rest.metadata._continue
    with pytest.raises(ApiException) as info:
        await call(lambda: api.list_namespaced_pod(n, label_selector="app=(oops"))
    assert info.value.status == 400
    await call(lambda: api.delete_collection_namespaced_pod(n, grace_period_seconds=0))
    await ns.wait_no_pods()


async def test_watch_from_a_resource_version_with_selector_transitions(ns: Tenant, api: k8s.CoreV1Api) -> None:
    n = ns.namespace
    listed = await call(lambda: api.list_namespaced_pod(n, label_selector="team=blue"))
    rv = listed.metadata.resource_version
    await call(lambda: api.create_namespaced_pod(n, pod_body("p-w", {"team": "red"})))
    await call(lambda: api.patch_namespaced_pod("p-w", n, {"metadata": {"labels": {"team": "blue"}}}))
    await call(lambda: api.patch_namespaced_pod("p-w", n, {"metadata": {"labels": {"team": "green"}}}))

    def collect() -> list[tuple[str, str | None]]:
        seen: list[tuple[str, str | None]] = []
        w = watch.Watch()
        for ev in w.stream(
            api.list_namespaced_pod, n, label_selector="team=blue", resource_version=rv,
            allow_watch_bookmarks=True, timeout_seconds=4,
        ):  # fmt: skip
            obj = ev["object"]
            name = obj.metadata.name if hasattr(obj, "metadata") else None
            seen.append((ev["type"], name))
        return seen

    events = await call(collect)
    changes = [e for e in events if e[0] != "BOOKMARK"]
    assert changes[0] == ("ADDED", "p-w") and changes[-1] == ("DELETED", "p-w"), events
    # a divergence: while it is blue the scheduler may bind it (a real server sends that as MODIFIED; the
    # test server schedules at once)
    assert set(changes[1:-1]) <= {("MODIFIED", "p-w")}, events
    # (no bookmark asserted: the real server sends one only once the resourceVersion has moved past the
    # watch's, which nothing here ensures; test_cluster_pods' bookmark test drives its own churn)
    await call(lambda: api.delete_namespaced_pod("p-w", n, grace_period_seconds=0))
    await ns.wait_no_pods()


async def test_exec_with_stdin_and_an_exit_code(ns: Tenant, api: k8s.CoreV1Api) -> None:
    n = ns.namespace
    await call(lambda: api.create_namespaced_pod(n, pod_body("p-x")))
    await running(api, n, "p-x")

    def run() -> tuple[str, str, int | None, str | None]:
        resp = stream(
            api.connect_get_namespaced_pod_exec, "p-x", n,
            command=["/bin/sh", "-c", "cat; echo err >&2; exit 3"],
            stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False,
        )  # fmt: skip
        resp.write_stdin("hello from the official client\n")
        resp.close_channel(0)
        resp.run_forever(timeout=20)
        out, err = resp.read_stdout(), resp.read_stderr()
        code, protocol = resp.returncode, resp.subprotocol
        resp.close()
        # websocket-client's close() does nothing once the peer closed first (the exec ended), so the
        # TLS socket is left to the collector and warns in whatever test runs then: shutdown() closes it
        resp.sock.shutdown()
        return out, err, code, protocol

    out, err, code, protocol = await call(run)
    assert (out, err, code) == ("hello from the official client\n", "err\n", 3)
    assert protocol == "v5.channel.k8s.io"
    await call(lambda: ns.cluster.fault(n, "p-x", "evict"))
    with anyio.fail_after(HANG_GUARD_SECONDS):
        while (await call(lambda: api.read_namespaced_pod("p-x", n))).status.phase != "Failed":  # noqa: ASYNC110
            await anyio.sleep(0.2)
    await call(lambda: api.delete_namespaced_pod("p-x", n, grace_period_seconds=0))
    await ns.wait_no_pods()


async def test_kubectl_sees_and_runs_in_the_backends_pods(ns: Tenant) -> None:
    backend = ns.backend()
    spec = make_spec("kubectl")
    try:
        await backend.create(spec)
        sid = spec.sandbox_id
        out = await ns.kubectl("-n", ns.namespace, "get", "pods", "-l", "app.kubernetes.io/managed-by", "-o", "json")
        (pod,) = json.loads(out)["items"]
        assert pod["metadata"]["name"] == sid and pod["spec"]["containers"][0]["image"] == IMAGE
        out = await ns.kubectl(
            "-n", ns.namespace, "exec", "-i", sid, "--", "/bin/sh", "-c", "cat; echo done", input="in\n"
        )
        assert out == "in\ndone\n"
        await ns.kubectl("-n", ns.namespace, "delete", "pod", sid, "--wait=true", "--timeout=60s")
        view = await backend.watch.refresh(sid)  # type: ignore[union-attr]
        assert not view.exists
    finally:
        await backend.aclose()
    await ns.wait_no_pods()
