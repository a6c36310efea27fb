"""Real servers on 127.0.0.1 for the image tests.

- :class:`Registry`: the CNCF distribution registry (Debian's ``docker-registry``), anonymous, behind
  htpasswd (Basic), or trusting :class:`TokenServer`'s tokens (Bearer);
- :class:`TokenServer`: a token realm of our own (no real one is at hand offline): checks Basic
  credentials and signs an RS256 JWT with a key whose certificate the registry trusts;
- :class:`FaultProxy`: in front of a registry, answers 503 to the first N requests matching a
  path, or corrupts blob bodies: what a real registry cannot be made to do. It records every
  request it forwards.
"""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REGISTRY_BINARY = shutil.which("docker-registry")
READY_SECONDS = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Registry:
    """``docker-registry serve`` on a free loopback port, storage under ``root``."""

    def __init__(self, root: Path, auth: dict[str, Any] | None = None) -> None:
        assert REGISTRY_BINARY is not None
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        config = {
            "version": 0.1,
            "log": {"level": "error"},
            "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
            "http": {"addr": self.host},
        }
        if auth:
            config["auth"] = auth
        path = root / "config.yml"
        path.write_text(json.dumps(config))  # JSON is YAML
        self.log = open(root / "registry.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen([REGISTRY_BINARY, "serve", str(path)], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2).close()
                break
            except urllib.error.HTTPError:
                break  # 401: up, and asking for credentials
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the registry did not start: {(root / 'registry.log').read_text()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class _Server:
    """A ThreadingHTTPServer on a free loopback port, in a daemon thread."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer(_Server):
    """``GET /token?service=&scope=``: Basic ``user:password`` -> a JWT for the scope's actions."""

    SERVICE = "cwsandbox-test-registry"
    ISSUER = "cwsandbox-test-token-server"

    def __init__(self, root: Path, user: str, password: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        self.user, self.password = user, password
        self.requests: list[dict[str, str]] = []
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "token-signer")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(1)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_der = cert.public_bytes(serialization.Encoding.DER)
        self.bundle = root / "token-ca.pem"
        self.bundle.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        super().__init__(_TokenHandler)

    def registry_auth(self) -> dict[str, Any]:
        return {
            "token": {
                "realm": f"http://{self.host}/token",
                "service": self.SERVICE,
                "issuer": self.ISSUER,
                "rootcertbundle": str(self.bundle),
            }
        }

    def sign(self, repository: str, actions: list[str]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(self.cert_der).decode()]}
        now = int(time.time())
        claims = {
            "iss": self.ISSUER,
            "sub": self.user,
            "aud": self.SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": f"{now}-{len(self.requests)}",
            "access": [{"type": "repository", "name": repository, "actions": actions}],
        }
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64url(signature)}"


class _TokenHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        import urllib.parse

        owner: TokenServer = self.server.owner  # type: ignore[attr-defined]
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        auth = self.headers.get("Authorization", "")
        owner.requests.append({"path": self.path, "authorization": auth, **query})
        expected = "Basic " + base64.b64encode(f"{owner.user}:{owner.password}".encode()).decode()
        if auth != expected:
            self._answer(401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad user name or password"}]})
            return
        _, repository, actions = query.get("scope", "repository::").split(":", 2)
        self._answer(200, {"token": owner.sign(repository, actions.split(",")), "expires_in": 300})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FaultProxy(_Server):
    """Forwards GETs to ``upstream``; ``fail_next(n, part)`` answers 503 to the next n requests
    whose path contains ``part``; ``corrupt`` flips a byte of every blob body, ``corrupt_manifests`` changes
    every manifest asked for by digest;
    ``blobs_wait_for_manifests = n`` serves no blob before n manifest requests came (so n pullers
    are surely in flight together). ``requests`` lists the paths (failures marked ``503``)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: list[str] = []
        self.failures: list[tuple[str, int]] = []
        self.retry_after: str | None = "0"
        self.corrupt = False
        self.corrupt_manifests = False
        self.blobs_wait_for_manifests = 0
        self.manifests_seen = threading.Condition()
        self.stalls: list[tuple[str, int]] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        super().__init__(_ProxyHandler)

    def fail_next(self, n: int, part: str) -> None:
        with self.lock:
            self.failures.append((part, n))

    def stall_next(self, n: int, part: str) -> None:
        """The next n requests whose path contains ``part`` get no answer until the proxy stops."""
        with self.lock:
            self.stalls.append((part, n))

    def _should_stall(self, path: str) -> bool:
        with self.lock:
            for i, (part, n) in enumerate(self.stalls):
                if part in path and n > 0:
                    self.stalls[i] = (part, n - 1)
                    return True
        return False

    def stop(self) -> None:
        self.stopping.set()
        with self.manifests_seen:
            self.blobs_wait_for_manifests = 0
            self.manifests_seen.notify_all()
        super().stop()

    def _should_fail(self, path: str) -> bool:
        with self.lock:
            for i, (part, n) in enumerate(self.failures):
                if part in path and n > 0:
                    self.failures[i] = (part, n - 1)
                    return True
        return False


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        owner: FaultProxy = self.server.owner  # type: ignore[attr-defined]
        if owner._should_fail(self.path):
            owner.requests.append(f"503 {self.path}")
            body = b'{"errors":[{"code":"UNAVAILABLE","message":"injected"}]}'
            self.send_response(503)
            if owner.retry_after is not None:
                self.send_header("Retry-After", owner.retry_after)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if owner._should_stall(self.path):
            owner.requests.append(f"stalled {self.path}")
            owner.stopping.wait(timeout=120)
            return
        with owner.manifests_seen:
            owner.requests.append(self.path)
            owner.manifests_seen.notify_all()
            if "/blobs/" in self.path and owner.blobs_wait_for_manifests:
                # every puller is in flight before any blob is served (a barrier, with a hang guard)
                owner.manifests_seen.wait_for(
                    lambda: sum("/manifests/" in r for r in owner.requests) >= owner.blobs_wait_for_manifests,
                    timeout=60,
                )
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "authorization")}
        request = urllib.request.Request(f"http://{owner.upstream}{self.path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, body, reply = response.status, response.read(), response.headers
        except urllib.error.HTTPError as exc:
            status, body, reply = exc.code, exc.read(), exc.headers
        if owner.corrupt and "/blobs/" in self.path and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        if owner.corrupt_manifests and "/manifests/sha256:" in self.path:
            body = body + b" "  # the same JSON, another digest
        self.send_response(status)
        for key in ("Content-Type", "Docker-Content-Digest", "WWW-Authenticate"):
            if reply.get(key):
                self.send_header(key, reply[key])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
