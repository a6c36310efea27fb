"""Configuration and credentials: kubeconfig (merged, contexts), token files, exec plugins, TLS, proxies, in-cluster."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxBackendUnavailableError, SandboxError
from cwsandbox_async.backends.kubernetes import KubernetesBackend, KubernetesOptions
from cwsandbox_async.backends.kubernetes._connect import connect
from cwsandbox_async.testing.contract import make_request, make_spec

from .certs import OPENSSL, Certs, make_certs, server_context
from .conftest import TEST_IMAGE, needs_bwrap
from .server import KubeTestServer

PLUGIN = """
import json, os, pathlib, sys
d = pathlib.Path(os.environ["PLUGIN_DIR"])
count = d / "count"
count.write_text(str(int(count.read_text()) + 1 if count.exists() else 1))
if (d / "fail").exists():
    print("plugin: login required", file=sys.stderr)
    sys.exit(3)
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
status = {"token": (d / "token").read_text().strip()}
if (d / "expiry").exists():
    status["expirationTimestamp"] = (d / "expiry").read_text().strip()
print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}))
"""


def kubeconfig(
    path: Path, server: str, user: dict[str, Any], *, cluster: dict[str, Any] | None = None, namespace: str = "team-a"
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "test", "context": {"cluster": "c", "user": "u", "namespace": namespace}},
            {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "team-b"}},
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def b64(p: Path) -> str:
    return base64.b64encode(p.read_bytes()).decode()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if OPENSSL is None:
        pytest.skip("openssl is needed to make test certificates")
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def dns_only_certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if OPENSSL is None:
        pytest.skip("openssl is needed to make test certificates")
    return make_certs(tmp_path_factory.mktemp("dnscerts"), ip_san=False)


@contextlib.asynccontextmanager
async def running(server: KubeTestServer) -> AsyncIterator[KubeTestServer]:
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def backend_for(**options: Any) -> AsyncIterator[KubernetesBackend]:
    backend = KubernetesBackend(image=TEST_IMAGE, **options)
    try:
        yield backend
    finally:
        await backend.aclose()


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)


# -- kubeconfig ----------------------------------------------------------------------------
async def test_kubeconfig_token_context_and_namespace(tmp_path: Path, no_env: None) -> None:
    async with running(KubeTestServer(tokens={"t0"})) as server:
        path = kubeconfig(tmp_path / "config", server.url, {"token": "t0"})
        async with backend_for(kubeconfig=str(path)) as backend:
            assert await backend.list([]) == []
        async with backend_for(kubeconfig=str(path), context="other") as backend:
            assert await backend.list([]) == []
        paths = [r.path for r in server.requests]
        assert paths == ["/api/v1/namespaces/team-a/pods", "/api/v1/namespaces/team-b/pods"]
        assert all(r.headers["Authorization"] == "Bearer t0" for r in server.requests)
        assert all(r.headers["User-Agent"].startswith("cwsandbox-async/") for r in server.requests)


async def test_kubeconfig_files_merge_first_definition_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env: None
) -> None:
    first = tmp_path / "a"
    first.write_text(
        json.dumps({"current-context": "ctx", "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}]})
    )
    second = kubeconfig(
        tmp_path / "b", "https://example.test:6443", {"tokenFile": "tok"}, cluster={"tls-server-name": "api"}
    )
    (tmp_path / "tok").write_text("from-file\n")
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    conn = await connect(KubernetesOptions())
    assert (conn.server, conn.namespace) == ("https://example.test:6443", "default")
    assert conn.configuration.tls_server_name == "api"
    # relative paths resolve next to the file that names them; the file's newline is not part of the token
    assert conn.configuration.api_key["BearerToken"] == "Bearer from-file"
    assert (await connect(KubernetesOptions(namespace="x"))).namespace == "x"


@pytest.mark.parametrize(
    ("user", "match"),
    [
        ({"client-certificate-data": "eA=="}, "without a key"),
        ({"as": "admin"}, "impersonation"),  # kubernetes-asyncio would ignore it and act with the user's own rights
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1"}}, "missing key 'command'"),
    ],
)
async def test_unsupported_kubeconfigs_are_clear_errors(
    tmp_path: Path, user: dict[str, Any], match: str, no_env: None
) -> None:
    path = kubeconfig(tmp_path / "config", "https://x", user)
    with pytest.raises(SandboxBackendUnavailableError, match=match):
        await connect(KubernetesOptions(kubeconfig=str(path)))


async def test_missing_configuration_is_backend_unavailable(tmp_path: Path, no_env: None) -> None:
    with pytest.raises(SandboxBackendUnavailableError, match="no kubeconfig"):
        await connect(KubernetesOptions(kubeconfig=str(tmp_path / "nope")))
    path = kubeconfig(tmp_path / "config", "https://x", {})
    with pytest.raises(SandboxBackendUnavailableError, match="context 'missing'"):
        await connect(KubernetesOptions(kubeconfig=str(path), context="missing"))


# -- credentials that change ------------------------------------------------------------------
async def test_token_file_is_reread_after_a_401(tmp_path: Path) -> None:
    async with running(KubeTestServer(tokens={"old"})) as server:
        tok = tmp_path / "token"
        tok.write_text("old")
        async with backend_for(server=server.url, token_file=str(tok)) as backend:
            await backend.list([])
            server.tokens = {"new"}  # the service account token rotated
            tok.write_text("new")
            await backend.list([])
        auths = [r.headers["Authorization"] for r in server.requests]
        assert auths == ["Bearer old", "Bearer old", "Bearer new"]


async def test_exec_plugin_is_cached_refreshed_on_401_and_reports_failure(tmp_path: Path, no_env: None) -> None:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    (tmp_path / "token").write_text("p1")
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(tmp_path / "plugin.py")],
            "env": [{"name": "PLUGIN_DIR", "value": str(tmp_path)}],
            "interactiveMode": "Never",
            "installHint": "install the test plugin",
        }
    }
    count = tmp_path / "count"
    async with running(KubeTestServer(tokens={"p1"})) as server:
        path = kubeconfig(tmp_path / "config", server.url, user)
        async with backend_for(kubeconfig=str(path)) as backend:
            for _ in range(5):
                await backend.list([])
            assert count.read_text() == "1"  # cached: no expiry was given
            server.tokens = {"p2"}
            (tmp_path / "token").write_text("p2")
            await backend.list([])
            assert count.read_text() == "2"  # the 401 made it run again
        (tmp_path / "expiry").write_text("2000-01-01T00:00:00Z")  # already expired: never cached
        async with backend_for(kubeconfig=str(path)) as backend:
            await backend.list([])
            runs = int(count.read_text())
            await backend.list([])
            assert int(count.read_text()) == runs + 1  # run again for the next request
        (tmp_path / "fail").write_text("")
        async with backend_for(kubeconfig=str(path)) as backend:
            with pytest.raises(SandboxBackendUnavailableError, match=r"login required.*install the test plugin"):
                await backend.list([])


# -- TLS ---------------------------------------------------------------------------------------
@needs_bwrap
async def test_tls_with_ca_data_rest_and_exec(certs: Certs, tmp_path: Path, no_env: None) -> None:
    async with running(KubeTestServer(ssl_context=server_context(certs))) as server:
        assert server.url.startswith("https://")
        path = kubeconfig(
            tmp_path / "config", server.url, {"token": "x"}, cluster={"certificate-authority-data": b64(certs.ca)}
        )
        async with backend_for(kubeconfig=str(path)) as backend:
            spec = make_spec("tls")
            with anyio.fail_after(HANG_GUARD_SECONDS):
                await backend.create(spec)
                r = await backend.exec(spec.sandbox_id, make_request("echo", "over tls"))
            assert r.stdout == b"over tls\n"
        async with backend_for(server=server.url, max_retries=0) as backend:  # the system CAs do not know ours
            with pytest.raises(SandboxBackendUnavailableError, match="TLS"):
                await backend.list([])


@needs_bwrap
async def test_tls_server_name_and_client_certificates(dns_only_certs: Certs, tmp_path: Path, no_env: None) -> None:
    c = dns_only_certs
    ctx = server_context(c, require_client_cert=True)
    async with running(KubeTestServer(ssl_context=ctx)) as server:
        cluster = {"certificate-authority-data": b64(c.ca), "tls-server-name": "kubernetes.test"}
        user = {"client-certificate-data": b64(c.client_cert), "client-key-data": b64(c.client_key)}
        path = kubeconfig(tmp_path / "config", server.url, user, cluster=cluster)
        async with backend_for(kubeconfig=str(path)) as backend:
            spec = make_spec("mtls")
            with anyio.fail_after(HANG_GUARD_SECONDS):
                await backend.create(spec)
                r = await backend.exec(spec.sandbox_id, make_request("echo", "mtls"))
            assert r.stdout == b"mtls\n"
        no_sni = kubeconfig(tmp_path / "nosni", server.url, user, cluster={"certificate-authority-data": b64(c.ca)})
        async with backend_for(kubeconfig=str(no_sni), max_retries=0) as backend:  # 127.0.0.1 is not in the cert
            with pytest.raises(SandboxBackendUnavailableError, match="TLS"):
                await backend.list([])
        no_cert = kubeconfig(tmp_path / "nocert", server.url, {"token": "x"}, cluster=cluster)
        async with backend_for(kubeconfig=str(no_cert), max_retries=0) as backend:
            with pytest.raises(SandboxError):
                await backend.list([])


async def test_in_cluster_service_account(
    certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env: None
) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token\n")
    (sa / "namespace").write_text("sandboxes")
    (sa / "ca.crt").write_bytes(certs.ca.read_bytes())
    async with running(KubeTestServer(ssl_context=server_context(certs), tokens={"sa-token"})) as server:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config: in-cluster is picked automatically
        async with backend_for(service_account_dir=str(sa)) as backend:
            assert await backend.list([]) == []
            assert backend.namespace == "sandboxes"
        assert server.requests[0].path == "/api/v1/namespaces/sandboxes/pods"


# -- proxy ---------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def connect_proxy() -> AsyncIterator[tuple[str, list[str]]]:
    """A minimal HTTP CONNECT proxy that records the targets it tunnelled to."""
    seen: list[str] = []
    tasks: set[asyncio.Task[None]] = set()

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        w.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
        assert method == "CONNECT"
        seen.append(target)
        host, port = target.rsplit(":", 1)
        up_r, up_w = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        for t in (asyncio.create_task(pipe(reader, up_w)), asyncio.create_task(pipe(up_r, writer))):
            tasks.add(t)
            t.add_done_callback(tasks.discard)

    proxy = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        proxy.close()
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await proxy.wait_closed()


@needs_bwrap
async def test_proxy_url_carries_rest_and_exec(certs: Certs, tmp_path: Path, no_env: None) -> None:
    async with running(KubeTestServer(ssl_context=server_context(certs))) as server, connect_proxy() as (proxy, seen):
        cluster = {"certificate-authority-data": b64(certs.ca), "proxy-url": proxy}
        path = kubeconfig(tmp_path / "config", server.url, {"token": "x"}, cluster=cluster)
        async with backend_for(kubeconfig=str(path)) as backend:
            spec = make_spec("proxy")
            with anyio.fail_after(HANG_GUARD_SECONDS):
                await backend.create(spec)
                r = await backend.exec(spec.sandbox_id, make_request("echo", "via proxy"))
            assert r.stdout == b"via proxy\n"
        assert seen and set(seen) == {f"127.0.0.1:{server.port}"}
        assert len(seen) >= 2  # REST connections and the exec upgrade (upgraded sockets are never pooled)


async def test_unusable_tls_material_is_the_callers_configuration(tmp_path: Path, no_env: None) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_bytes(b"-----BEGIN CERTIFICATE-----\njunk\n-----END CERTIFICATE-----\n")
    cluster = {"certificate-authority-data": b64(junk)}
    bad = kubeconfig(tmp_path / "config", "https://127.0.0.1:1", {"token": "x"}, cluster=cluster)
    async with backend_for(kubeconfig=str(bad), max_retries=0) as backend:
        with pytest.raises(SandboxBackendUnavailableError) as info:
            await backend.list([])
    assert not info.value.infrastructure, info.value
