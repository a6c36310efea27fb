"""Where the cluster is and how to authenticate, through kubernetes-asyncio's own loaders.

``kubernetes_asyncio.config`` does the jobs a cluster's users already trust it with:
kubeconfig merging (``$KUBECONFIG`` lists, the first definition of a name wins, paths
relative to the file that names them), contexts, client certificates, CA data, tokens,
``tls-server-name``, ``proxy-url``, exec credential plugins, OIDC and GCP auth
providers, and the in-cluster service account. Its ``Configuration`` then feeds
``RESTClientObject``, whose aiohttp session (TLS context, proxy, SNI) every request of
this backend uses. Measured on this machine: importing it costs ~0.17 s and ~38 MiB over
aiohttp alone, once per process that uses this backend (``import cwsandbox_async``
imports none of it).

Kept here, because kubernetes-asyncio lacks it:

- **credentials that change**: a token file (``token_file``, the in-cluster service
  account) is re-read every ``token_refresh_seconds`` and after a 401; a kubeconfig's
  ``tokenFile`` and exec plugin are loaded again after a 401, and the plugin when its
  ``expirationTimestamp`` passes (the library only runs it when a config is loaded), each
  run within ``credential_timeout_seconds``; tokens are stripped (the library keeps a
  file's trailing newline, which aiohttp refuses in a header);
- **refusing what it would silently ignore**: impersonation (``as``, ``as-groups``,
  ``as-uid``) would run with the user's own, larger rights; a client certificate without
  its key;
- **clear errors**: every problem (no configuration, a missing file, an unknown context,
  a failing plugin, with its install hint) raises ``SandboxBackendUnavailableError``.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader
from kubernetes_asyncio.config.kube_config import ConfigNode, KubeConfigLoader, KubeConfigMerger

from ..._errors import SandboxBackendUnavailableError
from ._options import KubernetesOptions

__all__ = ["Connection", "connect"]

#: What the loaders raise for a configuration they cannot use (yaml errors included).
_CONFIG_ERRORS = (ConfigException, OSError, ValueError, KeyError, TypeError, yaml.YAMLError)


def _fail(msg: str) -> SandboxBackendUnavailableError:
    return SandboxBackendUnavailableError(f"kubernetes configuration: {msg}", infrastructure=False)  # the caller's


@dataclass
class Connection:
    """A resolved connection: kubernetes-asyncio's ``Configuration`` plus what to do after a 401."""

    configuration: Configuration
    namespace: str
    source: str
    #: Refresh the credentials (a 401 came back); False if nothing could change.
    refresh: Callable[[], Awaitable[bool]]

    @property
    def server(self) -> str:
        return str(self.configuration.host)


class _TokenFile:
    """A bearer token read from a file, re-read when stale or after a 401 (``install`` hooks it in)."""

    def __init__(self, path: str, ttl: float) -> None:
        self.path = path
        self.ttl = ttl
        self._read_at = -float("inf")

    async def load(self, cfg: Configuration) -> None:
        try:
            token = (await anyio.Path(self.path).read_text()).strip()
        except OSError as exc:
            raise SandboxBackendUnavailableError(
                f"cannot read token file {self.path}: {exc}", infrastructure=False
            ) from exc
        cfg.api_key["BearerToken"] = f"Bearer {token}"
        self._read_at = time.monotonic()

    def install(self, cfg: Configuration) -> None:
        async def hook(c: Configuration) -> None:
            if time.monotonic() - self._read_at >= self.ttl:
                await self.load(c)

        cfg.refresh_api_key_hook = hook

    async def refresh(self, cfg: Configuration) -> bool:
        await self.load(cfg)
        return True


async def _explicit(o: KubernetesOptions) -> Connection:
    assert o.server is not None
    if not o.server.startswith(("http://", "https://")):
        raise _fail(f"server must be an http(s) URL, got {o.server!r}")
    cfg = Configuration(host=o.server.rstrip("/"))
    for path, what in ((o.ca_file, "ca_file"), (o.client_cert_file, "client_cert_file")):
        if path is not None and not await anyio.Path(path).is_file():
            raise _fail(f"cannot read {what} {path!r}")
    cfg.ssl_ca_cert = o.ca_file
    cfg.cert_file, cfg.key_file = o.client_cert_file, o.client_key_file
    cfg.verify_ssl = not o.insecure_skip_tls_verify
    cfg.tls_server_name, cfg.proxy = o.tls_server_name, o.proxy_url
    refresh: Callable[[], Awaitable[bool]] = _never
    if o.token is not None:
        cfg.api_key["BearerToken"] = f"Bearer {o.token}"
    elif o.token_file is not None:
        tokens = _TokenFile(o.token_file, o.token_refresh_seconds)
        await tokens.load(cfg)
        tokens.install(cfg)
        refresh = _bound(tokens.refresh, cfg)
    return Connection(cfg, o.namespace or "default", f"server {o.server}", refresh)


async def _never() -> bool:
    return False


def _bound(fn: Callable[[Configuration], Awaitable[bool]], cfg: Configuration) -> Callable[[], Awaitable[bool]]:
    async def call() -> bool:
        return await fn(cfg)

    return call


async def _in_cluster(o: KubernetesOptions) -> Connection:
    base = Path(o.service_account_dir)
    loader = InClusterConfigLoader(str(base / "token"), str(base / "ca.crt"), try_refresh_token=False)
    cfg = Configuration()
    try:
        await anyio.to_thread.run_sync(loader.load_and_set, cfg)
    except _CONFIG_ERRORS as exc:
        raise _fail(f"in-cluster service account at {base}: {exc}") from exc
    tokens = _TokenFile(str(base / "token"), o.token_refresh_seconds)
    await tokens.load(cfg)
    tokens.install(cfg)
    ns = o.namespace
    if ns is None and (base / "namespace").is_file():
        ns = (await anyio.Path(base / "namespace").read_text()).strip() or None
    return Connection(cfg, ns or "default", f"in-cluster service account {base}", _bound(tokens.refresh, cfg))


def _kubeconfig_paths(o: KubernetesOptions) -> list[Path]:
    if o.kubeconfig:
        return [Path(o.kubeconfig).expanduser()]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path("~/.kube/config").expanduser()]


def _items(doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The named entries of a merged kubeconfig section (the merger wraps each in a ``ConfigNode``)."""
    items = [i.value if isinstance(i, ConfigNode) else i for i in doc.get(key) or []]
    return [i for i in items if isinstance(i, dict)]


def _merged(paths: list[Path], context: str | None) -> tuple[Any, str, dict[str, Any]]:
    """Merge the kubeconfig files (blocking: run in a thread); the merged config, the context and its user."""
    found = [p for p in paths if p.is_file()]
    if not found:
        raise _fail(f"no kubeconfig at {', '.join(map(str, paths))}")
    try:
        merger = KubeConfigMerger(os.pathsep.join(map(str, found)))
        merged = merger.config
        doc = merged.value if merged is not None else {}
    except _CONFIG_ERRORS as exc:
        raise _fail(f"cannot read {', '.join(map(str, found))}: {exc}") from exc
    # kubectl: the first file that sets current-context wins (the merger lets the last one win)
    firsts = [(merger.config_files[p] or {}).get("current-context") for p in merger.paths]
    name = context or next((c for c in firsts if c), None)
    if not name:
        raise _fail(f"{found[0]} sets no current-context; pass context=...")
    contexts = {c.get("name"): c.get("context") or {} for c in _items(doc, "contexts")}
    if name not in contexts:
        raise _fail(f"context {name!r} is not defined in {', '.join(map(str, found))}")
    user_name = contexts[name].get("user")
    users = {u.get("name"): u.get("user") or {} for u in _items(doc, "users")}
    user = users.get(user_name, {}) if user_name else {}
    for unsupported in ("as", "as-groups", "as-uid", "as-user-extra"):
        if user.get(unsupported):
            raise _fail(f"user {user_name!r} uses impersonation ({unsupported}), which is not supported")
    has_cert = bool(user.get("client-certificate") or user.get("client-certificate-data"))
    has_key = bool(user.get("client-key") or user.get("client-key-data"))
    if has_cert != has_key:
        raise _fail(f"user {user_name!r} has a client certificate without a key (or a key without a certificate)")
    return merged, str(name), user


async def _kubeconfig(o: KubernetesOptions) -> Connection:
    paths = _kubeconfig_paths(o)
    merged, name, user = await anyio.to_thread.run_sync(_merged, paths, o.context)
    exec_cfg = user.get("exec") if isinstance(user.get("exec"), dict) else None
    hint = f" ({str(exec_cfg['installHint']).strip()})" if exec_cfg and exec_cfg.get("installHint") else ""
    cfg = Configuration()
    loader = KubeConfigLoader(config_dict=merged, active_context=name, config_base_path=None)

    async def load() -> None:
        try:
            with anyio.fail_after(o.credential_timeout_seconds):
                await loader.load_and_set(cfg)
            if token := cfg.api_key.get("BearerToken"):  # a tokenFile's trailing newline is no header
                cfg.api_key["BearerToken"] = str(token).strip()
        except TimeoutError as exc:
            raise _fail(f"the credentials of context {name!r} took over {o.credential_timeout_seconds:g} s") from exc
        except _CONFIG_ERRORS as exc:
            raise _fail(f"context {name!r}: {exc}{hint}") from exc

    await load()
    if not str(cfg.host).startswith(("http://", "https://")):
        raise _fail(f"context {name!r} has no http(s) server URL")
    for key, value in (("tls_server_name", o.tls_server_name), ("proxy", o.proxy_url)):
        if value:
            setattr(cfg, key, value)
    if o.insecure_skip_tls_verify:
        cfg.verify_ssl = False

    async def refresh() -> bool:
        if exec_cfg is None and not user.get("tokenFile"):
            return False
        if hasattr(loader, "exec_plugin_expiry"):
            del loader.exec_plugin_expiry  # the 401 says the cached credential is no good
        await load()
        return True

    if exec_cfg is not None:

        async def hook(c: Configuration) -> None:
            expiry = getattr(loader, "exec_plugin_expiry", None)
            if isinstance(expiry, dt.datetime) and expiry.astimezone(dt.UTC) <= dt.datetime.now(dt.UTC):
                await load()

        cfg.refresh_api_key_hook = hook
    namespace = o.namespace or (loader.current_context or {}).get("context", {}).get("namespace") or "default"
    return Connection(cfg, namespace, f"kubeconfig context {name}", refresh)


async def connect(o: KubernetesOptions) -> Connection:
    """Resolve the connection: explicit ``server``, else kubeconfig, else in-cluster (or as ``in_cluster`` says).
    Raises ``SandboxBackendUnavailableError`` as the module docstring says."""
    if o.server is not None:
        return await _explicit(o)
    if o.in_cluster:
        return await _in_cluster(o)
    no_kubeconfig = not any([await anyio.Path(p).is_file() for p in _kubeconfig_paths(o)])
    if o.in_cluster is None and os.environ.get("KUBERNETES_SERVICE_HOST") and no_kubeconfig:
        return await _in_cluster(o)
    return await _kubeconfig(o)
