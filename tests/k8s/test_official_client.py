"""The test server, driven by a client nobody here wrote: the official ``kubernetes`` Python client.

If the server bent the wire protocol toward our own backend, this client would notice:
pods are created, listed with label and field selectors, watched from a resourceVersion
with bookmarks (a pod leaving the selection is DELETED), refused with the Status codes a
real API server uses (404, 409, 410, 422, 403), and exec'd into over v5 with stdin and an
exit code. The sync client runs in a worker thread; the server runs on this test's loop.
"""

from __future__ import annotations

import gc
import json
import warnings
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import pytest
from guards import HANG_GUARD_SECONDS
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from .conftest import needs_bwrap, wait_for
from .server import KubeTestServer

pytestmark = needs_bwrap

T = TypeVar("T")
NS = "default"


def pod_body(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "registry.test/busybox:1",
        "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
            "containers": [container],
            **spec,
        },
    }


@pytest.fixture
async def api(k8s_server: KubeTestServer) -> AsyncIterator[k8s.CoreV1Api]:
    cfg = k8s.Configuration(host=k8s_server.url)
    with k8s.ApiClient(cfg) as api_client:
        yield k8s.CoreV1Api(api_client)


async def call(fn: Callable[[], T]) -> T:
    with anyio.fail_after(HANG_GUARD_SECONDS):
        return await anyio.to_thread.run_sync(fn)


def status_of(exc: ApiException) -> dict[str, Any]:
    doc = json.loads(exc.body)
    assert doc["kind"] == "Status" and doc["code"] == exc.status
    return doc  # type: ignore[no-any-return]


async def running(k8s_server: KubeTestServer, name: str) -> None:
    await wait_for(lambda: k8s_server.pod(name)["status"].get("phase") == "Running")


async def test_create_get_conflict_invalid_and_forbidden(k8s_server: KubeTestServer, api: k8s.CoreV1Api) -> None:
    created = await call(lambda: api.create_namespaced_pod(NS, pod_body("p-one", {"app": "a"})))
    assert created.metadata.name == "p-one" and created.metadata.uid and created.metadata.resource_version
    got = await call(lambda: api.read_namespaced_pod("p-one", NS))
    assert got.metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as info:
        await call(lambda: api.create_namespaced_pod(NS, pod_body("p-one")))
    assert info.value.status == 409 and status_of(info.value)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as info:
        await call(lambda: api.read_namespaced_pod("p-none", NS))
    assert info.value.status == 404 and status_of(info.value)["reason"] == "NotFound"
    invalid = pod_body("Not_A_Name")
    with pytest.raises(ApiException) as info:
        await call(lambda: api.create_namespaced_pod(NS, invalid))
    assert info.value.status == 422 and status_of(info.value)["reason"] == "Invalid"
    privileged = pod_body("p-priv")
    privileged["spec"]["containers"][0]["securityContext"]["privileged"] = True
    with pytest.raises(ApiException) as info:
        await call(lambda: api.create_namespaced_pod(NS, privileged))
    assert info.value.status == 403 and "PodSecurity" in status_of(info.value)["message"]
    # not a pods path at all: a Status too, not plain text
    unknown = await call(lambda: api.api_client.rest_client.pool_manager.request("GET", k8s_server.url + "/apis/x/y"))
    assert unknown.status == 404 and json.loads(unknown.data)["reason"] == "NotFound"
    await call(lambda: api.delete_namespaced_pod("p-one", NS, grace_period_seconds=0))


async def test_list_with_label_and_field_selectors(k8s_server: KubeTestServer, api: k8s.CoreV1Api) -> None:
    for name, labels in (("p-a1", {"app": "a", "tier": "x"}), ("p-a2", {"app": "a"}), ("p-b", {"app": "b"})):
        await call(lambda n=name, lb=labels: api.create_namespaced_pod(NS, pod_body(n, lb)))  # type: ignore[misc]
    names = lambda pods: sorted(p.metadata.name for p in pods.items)  # noqa: E731 - tiny helper
    assert names(await call(lambda: api.list_namespaced_pod(NS, label_selector="app=a"))) == ["p-a1", "p-a2"]
    assert names(await call(lambda: api.list_namespaced_pod(NS, label_selector="app in (b),!tier"))) == ["p-b"]
    assert names(await call(lambda: api.list_namespaced_pod(NS, label_selector="app=a,tier"))) == ["p-a1"]
    await running(k8s_server, "p-b")
    by_field = await call(lambda: api.list_namespaced_pod(NS, field_selector="metadata.name=p-b,status.phase=Running"))
    assert names(by_field) == ["p-b"]
    page = await call(lambda: api.list_namespaced_pod(NS, limit=2))
    assert len(page.items) == 2 and page.metadata._continue
    rest = await call(lambda: api.list_namespaced_pod(NS, limit=2, _continue=page.metadata._continue))
    assert len(rest.items) == 1 and not rest.metadata._continue
    with pytest.raises(ApiException) as info:
        await call(lambda: api.list_namespaced_pod(NS, label_selector="app=(oops"))
    assert info.value.status == 400


async def test_watch_from_a_resource_version_with_bookmarks_and_selector_transitions(
    k8s_server: KubeTestServer, api: k8s.CoreV1Api
) -> None:
    k8s_server.bookmark_interval = 0.1
    k8s_server.compaction_interval = 3600  # this test is about selectors; compaction has its own below
    await call(lambda: api.create_namespaced_pod(NS, pod_body("p-w", {"team": "red"})))
    # The kubelet's status updates (scheduled, Running) are MODIFIED events too, a real server's as well:
    # let them happen before the pod turns blue, or one lands between ADDED and DELETED under load.
    await running(k8s_server, "p-w")
    listed = await call(lambda: api.list_namespaced_pod(NS, label_selector="team=blue"))
    rv = listed.metadata.resource_version
    # into the selection, then out of it again: ADDED, then DELETED (a real server does not say MODIFIED)
    await call(lambda: api.patch_namespaced_pod("p-w", NS, {"metadata": {"labels": {"team": "blue"}}}))
    await call(lambda: api.patch_namespaced_pod("p-w", NS, {"metadata": {"labels": {"team": "green"}}}))

    def collect() -> list[tuple[str, str | None]]:
        seen: list[tuple[str, str | None]] = []
        w = watch.Watch()
        for ev in w.stream(
            api.list_namespaced_pod, NS, label_selector="team=blue", resource_version=rv,
            allow_watch_bookmarks=True, timeout_seconds=1,
        ):  # fmt: skip
            obj = ev["object"]
            name = obj.metadata.name if hasattr(obj, "metadata") else None
            seen.append((ev["type"], name))
        return seen

    events = await call(collect)
    assert [e for e in events if e[0] != "BOOKMARK"] == [("ADDED", "p-w"), ("DELETED", "p-w")]
    assert ("BOOKMARK", None) in events or any(e[0] == "BOOKMARK" for e in events)


async def test_a_watch_or_continue_from_before_compaction_is_gone(
    k8s_server: KubeTestServer, api: k8s.CoreV1Api
) -> None:
    for name in ("p-c1", "p-c2"):
        await call(lambda n=name: api.create_namespaced_pod(NS, pod_body(n)))  # type: ignore[misc]
    page = await call(lambda: api.list_namespaced_pod(NS, limit=1))
    old_rv = page.metadata.resource_version
    await call(lambda: api.create_namespaced_pod(NS, pod_body("p-c3")))
    k8s_server.compaction_interval = 0.05
    await wait_for(lambda: k8s_server.compacted_rv > int(old_rv))

    def watch_old() -> None:
        for _ in watch.Watch().stream(api.list_namespaced_pod, NS, resource_version=old_rv, timeout_seconds=2):
            pass

    with pytest.raises(ApiException) as info:
        await call(watch_old)
    assert info.value.status == 410
    with pytest.raises(ApiException) as info:
        await call(lambda: api.list_namespaced_pod(NS, limit=1, _continue=page.metadata._continue))
    assert info.value.status == 410 and status_of(info.value)["reason"] == "Expired"


async def test_exec_with_stdin_and_an_exit_code(k8s_server: KubeTestServer, api: k8s.CoreV1Api) -> None:
    await call(lambda: api.create_namespaced_pod(NS, pod_body("p-x")))
    await running(k8s_server, "p-x")

    def run() -> tuple[str, str, int | None, str | None]:
        resp = stream(
            api.connect_get_namespaced_pod_exec, "p-x", NS,
            command=["/bin/sh", "-c", "cat; echo err >&2; exit 3"],
            stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False,
        )  # fmt: skip
        resp.write_stdin("hello from the official client\n")
        resp.close_channel(0)  # v5: end stdin, keep reading
        resp.run_forever(timeout=20)
        out, err = resp.read_stdout(), resp.read_stderr()
        code = resp.returncode
        protocol = resp.subprotocol
        resp.close()
        resp.sock.shutdown()  # close() is a no-op once the peer closed: this closes the socket
        return out, err, code, protocol

    out, err, code, protocol = await call(run)
    assert (out, err, code) == ("hello from the official client\n", "err\n", 3)
    assert protocol == "v5.channel.k8s.io"
    await k8s_server.evict("p-x")
    with warnings.catch_warnings():  # the client leaks the refused socket; not the server's business
        warnings.simplefilter("ignore", ResourceWarning)
        with pytest.raises(ApiException) as info:  # the apiserver refuses before the upgrade
            await call(lambda: stream(api.connect_get_namespaced_pod_exec, "p-x", NS, command=["true"], stdout=True))
        gc.collect()
    assert "400" in str(info.value) and "completed pod" in str(info.value)
