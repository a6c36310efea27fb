"""Throw-away TLS material for the test server (a CA, a server certificate, a client certificate), via openssl."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from guards import HANG_GUARD_SECONDS

__all__ = ["Certs", "make_certs", "server_context"]

OPENSSL = shutil.which("openssl")


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _run(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=HANG_GUARD_SECONDS)


def _leaf(d: Path, name: str, cn: str, ext: str) -> None:
    _run(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={cn}",
        cwd=d,
    )
    (d / f"{name}.ext").write_text(ext)
    _run(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        cwd=d,
    )


def make_certs(d: Path, *, ip_san: bool = True) -> Certs:
    """A CA, a server cert for ``kubernetes.test`` (and 127.0.0.1 when ``ip_san``), a client cert."""
    d.mkdir(parents=True, exist_ok=True)
    _run(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=cwsandbox-test-ca",
        cwd=d,
    )
    san = "DNS:kubernetes.test" + (",IP:127.0.0.1" if ip_san else "")
    _leaf(d, "server", "kubernetes.test", f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    _leaf(d, "client", "cwsandbox-test", "extendedKeyUsage=clientAuth\n")
    return Certs(d, d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")


def server_context(certs: Certs, *, require_client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(certs.ca)
    return ctx
