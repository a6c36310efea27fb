"""kubectl, a client nobody here wrote, works against the test server: get, watch, exec, delete.

It needs the discovery documents (``/api``, ``/apis``, ``/api/v1``), Status bodies, watches
with field selectors (``delete --wait``) and the v5 exec protocol (kubectl speaks
WebSockets since 1.31). Skipped where kubectl is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from .conftest import needs_bwrap, wait_for
from .server import KubeTestServer
from .test_official_client import pod_body

KUBECTL = shutil.which("kubectl")
pytestmark = [needs_bwrap, pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")]


async def kubectl(kubeconfig: Path, *args: str, stdin: bytes | None = None, check: bool = True) -> tuple[int, str]:
    assert KUBECTL is not None
    argv = [KUBECTL, f"--kubeconfig={kubeconfig}", "--request-timeout=20s", *args]
    with anyio.fail_after(HANG_GUARD_SECONDS):
        proc = await anyio.run_process(argv, input=stdin, check=False, stderr=subprocess.STDOUT)
    out = proc.stdout.decode(errors="replace")
    if check:
        assert proc.returncode == 0, out
    return proc.returncode, out


@pytest.fixture
def kubeconfig(k8s_server: KubeTestServer, tmp_path: Path) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": k8s_server.url}}],
        "users": [{"name": "test", "user": {"token": "anything"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "default"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(doc))
    return path


async def test_kubectl_get_exec_watch_and_delete(k8s_server: KubeTestServer, kubeconfig: Path) -> None:
    manifest = kubeconfig.parent / "pod.json"
    manifest.write_text(json.dumps(pod_body("kctl", {"app": "kctl"})))
    await kubectl(kubeconfig, "create", "--validate=false", "-f", str(manifest))
    await wait_for(lambda: k8s_server.pod("kctl")["status"].get("phase") == "Running")

    _, out = await kubectl(kubeconfig, "get", "pods", "-l", "app=kctl", "-o", "json")
    assert [p["metadata"]["name"] for p in json.loads(out)["items"]] == ["kctl"]
    _, out = await kubectl(kubeconfig, "get", "pods")
    assert "kctl" in out and "NAME" in out
    code, out = await kubectl(kubeconfig, "get", "pod", "missing", check=False)
    assert code != 0 and 'pods "missing" not found' in out

    _, out = await kubectl(kubeconfig, "exec", "-i", "kctl", "--", "/bin/sh", "-c", "cat; echo done", stdin=b"in\n")
    assert out == "in\ndone\n"
    code, out = await kubectl(kubeconfig, "exec", "kctl", "--", "/bin/sh", "-c", "echo bye; exit 4", check=False)
    # kubectl prints "command terminated with exit code 4" on its stderr (merged here) from another
    # goroutine than the one copying the remote stdout: under load it can come first (seen once).
    assert code == 4 and "bye" in out.splitlines(), out
    assert k8s_server.exec_protocols[-1] == "v5.channel.k8s.io"

    async with anyio.create_task_group() as tg:
        watched: list[str] = []

        async def watch() -> None:
            _, out = await kubectl(kubeconfig, "get", "pods", "-w", "--output-watch-events", "-o", "json",
                                   "--request-timeout=3s", check=False)  # fmt: skip
            decoder, text = json.JSONDecoder(), out.strip()
            while text:
                event, end = decoder.raw_decode(text)
                watched.append(event["type"])
                text = text[end:].strip()

        tg.start_soon(watch)
        await anyio.sleep(1.0)
        await kubectl(kubeconfig, "delete", "pod", "kctl", "--wait=true", "--timeout=20s")
    assert watched[0] == "ADDED" and "DELETED" in watched
    assert k8s_server.live_pods() == []
