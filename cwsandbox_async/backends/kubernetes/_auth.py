"""Credentials for each request: a bearer token and/or a TLS context, refreshed when they expire or on 401.

Sources, in the order kubeconfig gives them: a static token, a token file (re-read
every ``TOKEN_FILE_TTL`` seconds and after a 401, as service account tokens rotate),
client certificates, and exec credential plugins
(``client.authentication.k8s.io/v1`` and ``v1beta1``) whose output is cached until its
``expirationTimestamp`` and re-run after a 401. A plugin that fails, times out or
prints something that is not an ``ExecCredential`` raises
``SandboxBackendUnavailableError`` with its stderr and install hint.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import anyio

from ..._errors import SandboxBackendUnavailableError
from ..._log import log
from ._config import ClusterConfig, ExecPluginConfig

__all__ = ["AuthState", "Credentials", "parse_rfc3339"]

#: Seconds a token read from a file is trusted before it is read again.
TOKEN_FILE_TTL = 60.0
#: Seconds before a plugin credential's expiry at which it is refreshed.
EXPIRY_SKEW = 30.0
#: Seconds an exec plugin may run.
PLUGIN_TIMEOUT = 60.0


def parse_rfc3339(value: str) -> float:
    """Seconds since the epoch for a Kubernetes timestamp (``2024-01-02T03:04:05Z``, fractions allowed)."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class AuthState:
    """What one request carries: the Authorization header value and the TLS context (None for http)."""

    authorization: str | None
    ssl: ssl.SSLContext | None
    generation: int


def _ssl_context(cfg: ClusterConfig, cert_pem: str | None, key_pem: str | None) -> ssl.SSLContext:
    if cfg.insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.ca_pem:
        ctx = ssl.create_default_context(cadata=cfg.ca_pem)
    else:
        ctx = ssl.create_default_context()
    if cert_pem and key_pem:
        # ssl can only load a certificate chain from files: write both to a private temp dir, load, delete.
        with tempfile.TemporaryDirectory(prefix="cwsandbox-k8s-") as tmp:
            cert, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
            for path, data in ((cert, cert_pem), (key, key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(data)
            ctx.load_cert_chain(cert, key)
    return ctx


class Credentials:
    """Hands out the current ``AuthState``; ``invalidate`` after a 401 makes the next ``get`` refresh."""

    def __init__(self, cfg: ClusterConfig) -> None:
        self._cfg = cfg
        self._lock = anyio.Lock()
        self._state: AuthState | None = None
        self._expires = 0.0
        self._generation = 0
        self._cert: str | None = None
        self.plugin_runs = 0

    async def get(self) -> AuthState:
        state = self._state
        if state is not None and time.monotonic() < self._expires:
            return state
        async with self._lock:
            if self._state is not None and time.monotonic() < self._expires:
                return self._state
            self._state = await self._load()
            return self._state

    def invalidate(self, state: AuthState) -> bool:
        """Forget ``state`` (a 401 came back with it). False if nothing could change on a refresh."""
        cfg = self._cfg
        refreshable = cfg.exec_plugin is not None or cfg.token_file is not None
        if refreshable and self._state is not None and self._state.generation == state.generation:
            self._expires = 0.0
        return refreshable

    async def _load(self) -> AuthState:
        cfg = self._cfg
        self._generation += 1
        token, cert, key = cfg.token, cfg.client_cert_pem, cfg.client_key_pem
        expires = float("inf")
        if cfg.exec_plugin is not None:
            cred, plugin_expiry = await self._run_plugin(cfg.exec_plugin)
            token = cred.get("token") or token
            if cred.get("clientCertificateData") and cred.get("clientKeyData"):
                cert, key = cred["clientCertificateData"], cred["clientKeyData"]
            expires = plugin_expiry
        elif cfg.token_file is not None:
            try:
                token = (await anyio.Path(cfg.token_file).read_text()).strip()
            except OSError as exc:
                raise SandboxBackendUnavailableError(f"cannot read token file {cfg.token_file}: {exc}") from exc
            expires = time.monotonic() + TOKEN_FILE_TTL
        ctx = None
        if cfg.https:
            if self._state is not None and self._state.ssl is not None and cert == self._cert:
                ctx = self._state.ssl
            else:
                try:
                    ctx = await anyio.to_thread.run_sync(_ssl_context, cfg, cert, key)
                except (ssl.SSLError, OSError, ValueError) as exc:
                    raise SandboxBackendUnavailableError(f"bad TLS material in {cfg.source}: {exc}") from exc
            self._cert = cert
        self._expires = expires
        return AuthState(authorization=f"Bearer {token}" if token else None, ssl=ctx, generation=self._generation)

    async def _run_plugin(self, plugin: ExecPluginConfig) -> tuple[dict[str, Any], float]:
        if plugin.interactive_mode == "Always":
            raise SandboxBackendUnavailableError(
                f"exec credential plugin {plugin.command} needs an interactive terminal (interactiveMode: Always)"
            )
        spec: dict[str, Any] = {"interactive": False}
        if plugin.provide_cluster_info:
            cluster: dict[str, Any] = {"server": self._cfg.server, "insecure-skip-tls-verify": self._cfg.insecure}
            if self._cfg.ca_pem:
                import base64

                cluster["certificate-authority-data"] = base64.b64encode(self._cfg.ca_pem.encode()).decode()
            if self._cfg.tls_server_name:
                cluster["tls-server-name"] = self._cfg.tls_server_name
            if self._cfg.proxy_url:
                cluster["proxy-url"] = self._cfg.proxy_url
            ext = (self._cfg.extra.get("cluster") or {}).get("extensions") or []
            for e in ext:
                if isinstance(e, dict) and e.get("name") == "client.authentication.k8s.io/exec":
                    cluster["config"] = e.get("extension")
            spec["cluster"] = cluster
        info = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        hint = f" ({plugin.install_hint.strip()})" if plugin.install_hint else ""
        self.plugin_runs += 1
        try:
            with anyio.fail_after(PLUGIN_TIMEOUT):
                proc = await anyio.run_process(
                    [plugin.command, *plugin.args], env=env, check=False, stdin=subprocess.DEVNULL
                )
        except TimeoutError as exc:
            raise SandboxBackendUnavailableError(f"exec credential plugin {plugin.command} timed out") from exc
        except OSError as exc:
            raise SandboxBackendUnavailableError(
                f"exec credential plugin {plugin.command} could not be run: {exc.strerror or exc}{hint}"
            ) from exc
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()[-500:]
            raise SandboxBackendUnavailableError(
                f"exec credential plugin {plugin.command} exited {proc.returncode}: {err}{hint}"
            )
        try:
            doc = json.loads(proc.stdout)
            status = doc["status"]
            if doc.get("kind") != "ExecCredential" or not isinstance(status, dict):
                raise ValueError("not an ExecCredential")
            if not status.get("token") and not status.get("clientCertificateData"):
                raise ValueError("neither token nor clientCertificateData")
        except (ValueError, KeyError, TypeError) as exc:
            raise SandboxBackendUnavailableError(
                f"exec credential plugin {plugin.command} printed an invalid ExecCredential: {exc}"
            ) from exc
        expiry = float("inf")
        if status.get("expirationTimestamp"):
            try:
                wall_left = parse_rfc3339(status["expirationTimestamp"]) - time.time()
            except ValueError as exc:
                raise SandboxBackendUnavailableError(
                    f"exec credential plugin {plugin.command}: bad expirationTimestamp"
                ) from exc
            expiry = time.monotonic() + max(0.0, wall_left - EXPIRY_SKEW)
        log.debug("k8s exec credential refreshed", command=plugin.command)
        return status, expiry
