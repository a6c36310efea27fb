"""The cluster itself: the real control plane answers as 1.37, clients work, the nodes run pods for real.

Every pod here is pinned to a node (``nodeName``) when the exec path matters: ``node-1`` gets
exec as SPDY from the apiserver's WebSocket translator, ``node-2`` declares
ExtendWebSocketsToKubelet and gets the WebSocket passed through. Which path a request took is
read back twice, from the node's own counters and from the apiserver's
``apiserver_websocket_streaming_requests_total`` metric.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .cluster import Cluster

WAIT = 60.0


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def pod_manifest(name: str, node: str | None = None, command: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "cwsandbox/test:1", "command": command or ["sleep", "3600"]}],
        **spec,
    }
    if node is not None:
        body["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": body}


def get_pod(c: Cluster, name: str) -> dict[str, Any]:
    out = c.kubectl("get", "pod", name, "-o", "json", check=True)
    pod: dict[str, Any] = json.loads(out.stdout)
    return pod


class Pods:
    """Creates pods in ``default`` and deletes every one of them at the end of the test."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.names: list[str] = []

    def create(self, prefix: str, node: str | None = None, **kw: Any) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        if "image" in kw:
            image = kw.pop("image")
            manifest = pod_manifest(name, node, **kw)
            manifest["spec"]["containers"][0]["image"] = image
        else:
            manifest = pod_manifest(name, node, **kw)
        self.c.kubectl("create", "-f", "-", input=json.dumps(manifest), check=True)
        self.names.append(name)
        return name

    def running(self, prefix: str, node: str | None = None, **kw: Any) -> str:
        name = self.create(prefix, node, **kw)
        wait_for(f"{name} Running", lambda: get_pod(self.c, name)["status"].get("phase") == "Running")
        return name

    def close(self) -> None:
        if self.names:
            self.c.kubectl("delete", "pod", "--grace-period=0", "--wait=false", "--ignore-not-found", *self.names)


@pytest.fixture
def pods(real_cluster: Cluster) -> Iterator[Pods]:
    p = Pods(real_cluster)
    try:
        yield p
    finally:
        p.close()


def streaming_metric(c: Cluster) -> dict[str, float]:
    """``apiserver_websocket_streaming_requests_total`` for exec, by proxy_type."""
    found: dict[str, float] = {}
    for line in c.api_text("/metrics").splitlines():
        if line.startswith("apiserver_websocket_streaming_requests_total{") and 'subresource="exec"' in line:
            m = re.search(r'proxy_type="([^"]+)"', line)
            if m:
                found[m.group(1)] = float(line.rsplit(" ", 1)[1])
    return found


# -- the control plane ----------------------------------------------------------------------
def test_version_is_the_pinned_release(real_cluster: Cluster) -> None:
    version = real_cluster.api_get("/version")
    assert version["gitVersion"] == "v1.37.2"
    assert (version["major"], version["minor"]) == ("1", "37")
    out = real_cluster.kubectl("version", "-o", "json", check=True)
    both = json.loads(out.stdout)
    assert both["clientVersion"]["gitVersion"] == "v1.37.2"
    assert both["serverVersion"]["gitVersion"] == "v1.37.2"


def test_kubectl_sees_ready_nodes_and_the_default_service_account(real_cluster: Cluster) -> None:
    nodes = json.loads(real_cluster.kubectl("get", "nodes", "-o", "json", check=True).stdout)["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert sorted(by_name) == sorted(real_cluster.node_names)
    assert by_name["node-2"]["status"].get("declaredFeatures") == ["ExtendWebSocketsToKubelet"]
    assert not by_name["node-1"]["status"].get("declaredFeatures")
    for n in nodes:
        ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
    assert real_cluster.kubectl("get", "serviceaccount", "default", "-n", "default").returncode == 0


def test_admission_is_real(real_cluster: Cluster) -> None:
    """Pod Security admission of the real apiserver, not a model of it: a privileged pod in a
    ``restricted`` namespace is refused with the plugin's own message."""
    ns = f"restricted-{uuid.uuid4().hex[:6]}"
    real_cluster.kubectl("create", "namespace", ns, check=True)
    try:
        real_cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted", check=True)
        manifest = pod_manifest("p", "node-1")
        manifest["metadata"]["namespace"] = ns
        out = real_cluster.kubectl("create", "-f", "-", input=json.dumps(manifest))
        assert out.returncode != 0
        assert 'violates PodSecurity "restricted:latest"' in out.stderr
    finally:
        real_cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_official_python_client(real_cluster: Cluster, pods: Pods) -> None:
    kubernetes = pytest.importorskip("kubernetes")
    from kubernetes.stream import stream

    api_client = kubernetes.config.new_client_from_config(config_file=str(real_cluster.kubeconfig))
    try:
        v1 = kubernetes.client.CoreV1Api(api_client)
        assert {n.metadata.name for n in v1.list_node().items} == set(real_cluster.node_names)
        for node in real_cluster.node_names:
            name = pods.running("pyclient", node)
            resp = stream(v1.connect_get_namespaced_pod_exec, name, "default", command=["sh", "-c", "echo hi; exit 3"],
                          stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)  # fmt: skip
            resp.run_forever(timeout=30)
            assert resp.read_stdout() == "hi\n"
            assert resp.returncode == 3
            resp.close()
            resp.sock.shutdown()  # close() is a no-op once the peer closed: this closes the TLS socket
    finally:
        api_client.close()


# -- exec, both paths -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("node", "proxy_type", "node_counter"),
    [("node-1", "translated_at_apiserver", "spdy_requests"), ("node-2", "proxied_to_kubelet", "websocket_requests")],
)
def test_exec_exit_codes_and_stdin_on_both_paths(
    real_cluster: Cluster, pods: Pods, node: str, proxy_type: str, node_counter: str
) -> None:
    name = pods.running("exec", node)
    before_metric = streaming_metric(real_cluster).get(proxy_type, 0.0)
    before_node = real_cluster.node_stats()[node][node_counter]
    assert real_cluster.kubectl("exec", name, "--", "true").returncode == 0
    out = real_cluster.kubectl("exec", name, "--", "sh", "-c", "echo out; echo err >&2; exit 42")
    assert (out.returncode, out.stdout, out.stderr.splitlines()[0]) == (42, "out\n", "err")
    killed = real_cluster.kubectl("exec", name, "--", "sh", "-c", "kill -9 $$")
    assert killed.returncode == 137
    # stdin reaches the process and its close is seen (cat ends): v5's close frame, on both paths
    cat = real_cluster.kubectl("exec", "-i", name, "--", "sh", "-c", "cat; echo done", input="a\nb\n")
    assert (cat.returncode, cat.stdout) == (0, "a\nb\ndone\n")
    # the exec runs inside the pod's container: PID 1 is the pod's command
    ps = real_cluster.kubectl("exec", name, "--", "cat", "/proc/1/cmdline", check=True)
    assert ps.stdout == "sleep\x003600\x00"
    assert streaming_metric(real_cluster).get(proxy_type, 0.0) >= before_metric + 5
    assert real_cluster.node_stats()[node][node_counter] >= before_node + 5


@pytest.mark.parametrize("node", ["node-1", "node-2"])
def test_closing_the_exec_connection_does_not_kill_the_process(real_cluster: Cluster, pods: Pods, node: str) -> None:
    name = pods.running("close", node)
    kubectl = [str(real_cluster.binaries.path("kubectl")), f"--kubeconfig={real_cluster.kubeconfig}"]
    proc = subprocess.Popen([*kubectl, "exec", name, "--", "sleep", "171"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for("the exec'd sleep", lambda: any(
            p["cmdline"] == "sleep 171" for p in real_cluster.pod_processes("default", name)["main"]))  # fmt: skip
    finally:
        proc.kill()
        proc.wait(30)
    time.sleep(2)  # the connection is gone: give a wrongly-killing node time to kill
    left = [p["cmdline"] for p in real_cluster.pod_processes("default", name)["main"]]
    assert "sleep 171" in left


def test_exec_ends_with_137_when_the_container_dies(real_cluster: Cluster, pods: Pods) -> None:
    name = pods.running("die", "node-2")
    kubectl = [str(real_cluster.binaries.path("kubectl")), f"--kubeconfig={real_cluster.kubeconfig}"]
    proc = subprocess.Popen([*kubectl, "exec", name, "--", "sleep", "172"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for("the exec'd sleep", lambda: any(
            p["cmdline"] == "sleep 172" for p in real_cluster.pod_processes("default", name)["main"]))  # fmt: skip
        real_cluster.fault("default", name, "kill")
        assert proc.wait(30) == 137
    finally:
        proc.kill()
        proc.wait(30)


def test_exec_into_a_finished_pod_is_refused(real_cluster: Cluster, pods: Pods) -> None:
    name = pods.create("done", "node-1", command=["true"])
    wait_for("Succeeded", lambda: get_pod(real_cluster, name)["status"].get("phase") == "Succeeded")
    out = real_cluster.kubectl("exec", name, "--", "true")
    assert out.returncode != 0
    assert "cannot exec into a container in a completed pod" in out.stderr


def test_logs_are_the_containers_output(real_cluster: Cluster, pods: Pods) -> None:
    name = pods.create("logs", "node-1", command=["sh", "-c", "echo one; echo two >&2; sleep 3600"])
    wait_for("both lines in the log", lambda: real_cluster.kubectl("logs", name).stdout == "one\ntwo\n")
    assert real_cluster.kubectl("logs", "--tail=1", name).stdout == "two\n"


# -- pod status -----------------------------------------------------------------------------
def terminated(c: Cluster, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = get_pod(c, name)
        if pod["status"].get("phase") not in ("Succeeded", "Failed"):
            return None
        return pod

    pod: dict[str, Any] = wait_for(f"{name} to finish", check)
    return pod


@pytest.mark.parametrize(("command", "phase", "code", "reason"), [
    (["true"], "Succeeded", 0, "Completed"),
    (["sh", "-c", "exit 3"], "Failed", 3, "Error"),
    (["sh", "-c", "sleep 100 & kill -9 $!; wait $!"], "Failed", 137, "Error"),
    # PID 1 of a PID namespace ignores signals it has no handler for, even its own SIGKILL
    (["sh", "-c", "kill -9 $$; exit 4"], "Failed", 4, "Error"),
])  # fmt: skip
def test_exit_codes_become_pod_status(
    real_cluster: Cluster, pods: Pods, command: list[str], phase: str, code: int, reason: str
) -> None:
    name = pods.create("exit", command=command)
    pod = terminated(real_cluster, name)
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (pod["status"]["phase"], state["exitCode"], state["reason"]) == (phase, code, reason)


def test_pending_then_running_with_a_real_schedule(real_cluster: Cluster, pods: Pods) -> None:
    name = pods.create("sched")  # no nodeName: the real scheduler picks a node
    pod = wait_for("Running", lambda: (p := get_pod(real_cluster, name))["status"].get("phase") == "Running" and p)
    assert pod["spec"]["nodeName"] in real_cluster.node_names
    conds = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conds["PodScheduled"] == conds["Ready"] == conds["ContainersReady"] == "True"
    # what the real apiserver defaulted into the pod
    assert {t["key"] for t in pod["spec"]["tolerations"]} >= {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
    assert pod["status"]["qosClass"] == "BestEffort"


@pytest.mark.parametrize(("fault", "reason", "container_reason"), [
    ("kill", None, "Error"),
    ("oom", None, "OOMKilled"),
    ("evict", "Evicted", "ContainerStatusUnknown"),
])  # fmt: skip
def test_node_faults(real_cluster: Cluster, pods: Pods, fault: str, reason: str | None, container_reason: str) -> None:
    name = pods.running(f"fault-{fault}", "node-1")
    assert real_cluster.fault("default", name, fault) == "node-1"
    pod = terminated(real_cluster, name)
    st = pod["status"]
    state = st["containerStatuses"][0]["state"]["terminated"]
    assert (st["phase"], st.get("reason"), state["exitCode"], state["reason"]) == (
        "Failed",
        reason,
        137,
        container_reason,
    )
    disruption = [c for c in st["conditions"] if c["type"] == "DisruptionTarget"]
    assert bool(disruption) == (fault == "evict")


def test_image_pull_failure(real_cluster: Cluster, pods: Pods) -> None:
    name = pods.create("pull", image="registry.invalid/nothing:1")

    def waiting() -> str:
        statuses = get_pod(real_cluster, name)["status"].get("containerStatuses") or [{}]
        return str((statuses[0].get("state") or {}).get("waiting", {}).get("reason", ""))

    wait_for("ImagePullBackOff", lambda: waiting() == "ImagePullBackOff")
    assert get_pod(real_cluster, name)["status"]["phase"] == "Pending"


def test_active_deadline_seconds(real_cluster: Cluster, pods: Pods) -> None:
    name = pods.create("deadline", activeDeadlineSeconds=2)
    pod = terminated(real_cluster, name)
    assert (pod["status"]["phase"], pod["status"]["reason"]) == ("Failed", "DeadlineExceeded")
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def test_node_not_ready_is_tainted_and_recovers(real_cluster: Cluster) -> None:
    def taints() -> set[str]:
        node = json.loads(real_cluster.kubectl("get", "node", "node-1", "-o", "json", check=True).stdout)
        return {t["key"] for t in node["spec"].get("taints") or []}

    real_cluster.set_node_ready("node-1", False)
    try:
        wait_for("the not-ready taint", lambda: "node.kubernetes.io/not-ready" in taints())
    finally:
        real_cluster.set_node_ready("node-1", True)
    wait_for("the taint removed", lambda: not taints())


def test_deleting_a_pod_stops_its_container(real_cluster: Cluster, pods: Pods) -> None:
    """Graceful deletion: the node stops the container (``sleep`` as PID 1 ignores SIGTERM, so
    SIGKILL at the end of the 1 s grace period), then the pod object goes away."""
    name = pods.running("delete", "node-2")
    assert real_cluster.pod_processes("default", name) == {"main": []}  # the node runs it
    t0 = time.monotonic()
    real_cluster.kubectl("delete", "pod", name, "--grace-period=1", "--wait=true", "--timeout=60s", check=True)
    assert time.monotonic() - t0 >= 1.0  # the grace period was honoured, not skipped
    with pytest.raises(urllib.error.HTTPError) as err:
        real_cluster.pod_processes("default", name)
    assert err.value.code == 404
