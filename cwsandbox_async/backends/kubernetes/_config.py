"""Where the cluster is and how to authenticate: explicit options, kubeconfig, or the in-cluster service account.

``load_config`` is synchronous (it reads a few small files); the backend runs it in a
worker thread. Every problem (no configuration found, a missing file, a kubeconfig
that names an unknown context, an auth method we do not support) raises
``SandboxBackendUnavailableError`` naming the file and field at fault.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._errors import SandboxBackendUnavailableError
from ._options import KubernetesOptions

__all__ = ["ClusterConfig", "ExecPluginConfig", "load_config", "load_in_cluster", "load_kubeconfig"]


@dataclass(frozen=True)
class ExecPluginConfig:
    """A kubeconfig ``users[].user.exec`` credential plugin."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"
    provide_cluster_info: bool = False
    interactive_mode: str | None = None
    install_hint: str | None = None


@dataclass(frozen=True)
class ClusterConfig:
    """A resolved connection: server URL, TLS material and one way to authenticate."""

    server: str
    namespace: str = "default"
    ca_pem: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None
    token: str | None = None
    token_file: str | None = None
    client_cert_pem: str | None = None
    client_key_pem: str | None = None
    exec_plugin: ExecPluginConfig | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def https(self) -> bool:
        return self.server.startswith("https://")


def _fail(msg: str) -> SandboxBackendUnavailableError:
    return SandboxBackendUnavailableError(f"kubernetes configuration: {msg}")


def _read(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise _fail(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from exc


def _b64(data: str, what: str) -> str:
    try:
        return base64.b64decode(data, validate=False).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail(f"{what} is not valid base64 PEM") from exc


def _parse_yaml(text: str, path: str) -> dict[str, Any]:
    try:
        doc: Any = json.loads(text)  # JSON is YAML; saves the yaml import for generated configs
    except ValueError:
        try:
            yaml: Any = importlib.import_module("yaml")
        except ImportError as exc:
            raise _fail(f"{path} is YAML; install PyYAML (pip install pyyaml) to read it") from exc
        try:
            doc = yaml.safe_load(text)
        except Exception as exc:
            raise _fail(f"{path} is not valid YAML: {exc}") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise _fail(f"{path} is not a kubeconfig (top level is not a mapping)")
    return doc


def _kubeconfig_paths(options: KubernetesOptions) -> list[Path]:
    if options.kubeconfig:
        return [Path(options.kubeconfig).expanduser()]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path("~/.kube/config").expanduser()]


def _named(doc: dict[str, Any], key: str, inner: str, base: Path, into: dict[str, tuple[dict[str, Any], Path]]) -> None:
    for item in doc.get(key) or []:
        if isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"] not in into:
            body = item.get(inner) or {}
            into[item["name"]] = (body if isinstance(body, dict) else {}, base)


def _rel(base: Path, value: str) -> str:
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else base / p)


def load_kubeconfig(paths: list[Path], context: str | None, namespace: str | None) -> ClusterConfig:
    """Merge kubeconfig files (the first definition of each name wins) and resolve one context."""
    clusters: dict[str, tuple[dict[str, Any], Path]] = {}
    users: dict[str, tuple[dict[str, Any], Path]] = {}
    contexts: dict[str, tuple[dict[str, Any], Path]] = {}
    current: str | None = None
    found = [p for p in paths if p.is_file()]
    if not found:
        raise _fail(f"no kubeconfig at {', '.join(map(str, paths))}")
    for path in found:
        doc = _parse_yaml(_read(path, "kubeconfig"), str(path))
        base = path.parent
        _named(doc, "clusters", "cluster", base, clusters)
        _named(doc, "users", "user", base, users)
        _named(doc, "contexts", "context", base, contexts)
        if not current and isinstance(doc.get("current-context"), str) and doc["current-context"]:
            current = doc["current-context"]
    name = context or current
    if not name:
        raise _fail(f"{found[0]} sets no current-context; pass context=...")
    if name not in contexts:
        raise _fail(f"context {name!r} is not defined in {', '.join(map(str, found))}")
    ctx, _ = contexts[name]
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if cluster_name not in clusters:
        raise _fail(f"context {name!r} names cluster {cluster_name!r}, which is not defined")
    cluster, cbase = clusters[cluster_name]
    user, ubase = users.get(user_name, ({}, found[0].parent)) if user_name else ({}, found[0].parent)
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("http://", "https://")):
        raise _fail(f"cluster {cluster_name!r} has no http(s) server URL")
    ca_pem = None
    if cluster.get("certificate-authority-data"):
        ca_pem = _b64(cluster["certificate-authority-data"], "certificate-authority-data")
    elif cluster.get("certificate-authority"):
        ca_pem = _read(_rel(cbase, cluster["certificate-authority"]), "certificate-authority")
    kw: dict[str, Any] = {
        "server": server.rstrip("/"),
        "namespace": namespace or ctx.get("namespace") or "default",
        "ca_pem": ca_pem,
        "insecure": bool(cluster.get("insecure-skip-tls-verify", False)),
        "tls_server_name": cluster.get("tls-server-name") or None,
        "proxy_url": cluster.get("proxy-url") or None,
        "source": f"kubeconfig {found[0]} context {name}",
        "extra": {"cluster": cluster},
    }
    kw.update(_user_auth(user, ubase, user_name or ""))
    return ClusterConfig(**kw)


def _user_auth(user: dict[str, Any], base: Path, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if user.get("client-certificate-data"):
        out["client_cert_pem"] = _b64(user["client-certificate-data"], "client-certificate-data")
    elif user.get("client-certificate"):
        out["client_cert_pem"] = _read(_rel(base, user["client-certificate"]), "client-certificate")
    if user.get("client-key-data"):
        out["client_key_pem"] = _b64(user["client-key-data"], "client-key-data")
    elif user.get("client-key"):
        out["client_key_pem"] = _read(_rel(base, user["client-key"]), "client-key")
    if ("client_cert_pem" in out) != ("client_key_pem" in out):
        raise _fail(f"user {name!r} has a client certificate without a key (or a key without a certificate)")
    if user.get("token"):
        out["token"] = str(user["token"])
    elif user.get("tokenFile"):
        out["token_file"] = _rel(base, user["tokenFile"])
    if isinstance(user.get("exec"), dict):
        ex = user["exec"]
        command = ex.get("command")
        if not isinstance(command, str) or not command:
            raise _fail(f"user {name!r}: exec plugin has no command")
        if "/" in command and not os.path.isabs(command):
            command = _rel(base, command)
        out["exec_plugin"] = ExecPluginConfig(
            command=command,
            args=tuple(str(a) for a in ex.get("args") or ()),
            env=tuple((str(e["name"]), str(e.get("value", ""))) for e in ex.get("env") or () if "name" in e),
            api_version=str(ex.get("apiVersion") or "client.authentication.k8s.io/v1"),
            provide_cluster_info=bool(ex.get("provideClusterInfo", False)),
            interactive_mode=ex.get("interactiveMode"),
            install_hint=ex.get("installHint"),
        )
    if isinstance(user.get("auth-provider"), dict):
        provider = user["auth-provider"]
        id_token = (provider.get("config") or {}).get("id-token")
        if provider.get("name") == "oidc" and id_token:
            out.setdefault("token", str(id_token))  # static; refreshing OIDC tokens is not supported
        else:
            raise _fail(
                f"user {name!r} uses auth-provider {provider.get('name')!r}, which is not supported; "
                "use an exec credential plugin (e.g. kubelogin, gke-gcloud-auth-plugin)"
            )
    if user.get("username") or user.get("password"):
        raise _fail(f"user {name!r} uses basic auth, which Kubernetes removed; use a token or certificate")
    for unsupported in ("as", "as-groups", "as-uid"):
        if user.get(unsupported):
            raise _fail(f"user {name!r} uses impersonation ({unsupported}), which is not supported")
    return out


def load_in_cluster(sa_dir: str, namespace: str | None, environ: dict[str, str] | None = None) -> ClusterConfig:
    """The pod's service account: ``KUBERNETES_SERVICE_HOST/PORT``, token file (re-read), ``ca.crt``."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise _fail("not running in a cluster (KUBERNETES_SERVICE_HOST is not set)")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    base = Path(sa_dir)
    token_file = base / "token"
    if not token_file.is_file():
        raise _fail(f"service account token {token_file} is missing (automountServiceAccountToken false?)")
    ns = namespace
    if ns is None and (base / "namespace").is_file():
        ns = _read(base / "namespace", "service account namespace").strip() or None
    ca = base / "ca.crt"
    return ClusterConfig(
        server=f"https://{host}:{port}",
        namespace=ns or "default",
        ca_pem=_read(ca, "service account CA") if ca.is_file() else None,
        token_file=str(token_file),
        source=f"in-cluster service account {base}",
    )


def load_config(options: KubernetesOptions) -> ClusterConfig:
    """Resolve the connection: explicit ``server``, else kubeconfig, else in-cluster (or as ``in_cluster`` says)."""
    o = options
    if o.server is not None:
        if not o.server.startswith(("http://", "https://")):
            raise _fail(f"server must be an http(s) URL, got {o.server!r}")
        return ClusterConfig(
            server=o.server.rstrip("/"),
            namespace=o.namespace or "default",
            ca_pem=_read(o.ca_file, "ca_file") if o.ca_file else None,
            insecure=o.insecure_skip_tls_verify,
            tls_server_name=o.tls_server_name,
            proxy_url=o.proxy_url,
            token=o.token,
            token_file=o.token_file,
            client_cert_pem=_read(o.client_cert_file, "client_cert_file") if o.client_cert_file else None,
            client_key_pem=_read(o.client_key_file, "client_key_file") if o.client_key_file else None,
            source=f"server {o.server}",
        )
    if o.in_cluster:
        return load_in_cluster(o.service_account_dir, o.namespace)
    paths = _kubeconfig_paths(o)
    if o.in_cluster is None and not any(p.is_file() for p in paths) and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return load_in_cluster(o.service_account_dir, o.namespace)
    cfg = load_kubeconfig(paths, o.context, o.namespace)
    overrides: dict[str, Any] = {}
    if o.tls_server_name:
        overrides["tls_server_name"] = o.tls_server_name
    if o.proxy_url:
        overrides["proxy_url"] = o.proxy_url
    if o.insecure_skip_tls_verify:
        overrides["insecure"] = True
    if overrides:
        from dataclasses import replace

        cfg = replace(cfg, **overrides)
    return cfg
