"""The test cluster's PKI, via openssl: one CA, serving and client certificates, a ServiceAccount key pair.

Identities (CN / O): the admin ``cwsandbox-admin`` / ``system:masters``; the controller-manager
``system:kube-controller-manager``; the scheduler ``system:kube-scheduler``; the node process
``cwsandbox-node`` / ``cwsandbox:nodes``; the apiserver's client to the nodes
``kube-apiserver-kubelet-client``. Serving certificates for the apiserver (127.0.0.1, localhost,
``kubernetes.default.svc`` and the first service IP) and for the nodes (127.0.0.1). Certificates
are valid for two days. Raises ``subprocess.CalledProcessError`` when openssl fails.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is not on PATH: the cluster's PKI needs it")
    subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _leaf(d: Path, name: str, subject: str, ext: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=d)  # fmt: skip
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


def make_pki(d: Path) -> Pki:
    """Write the CA, every certificate and the ServiceAccount keys into ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=cwsandbox-cluster-ca", cwd=d)  # fmt: skip
    client = "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n"
    sans = "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    sans += ",DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.0.0.1"
    _leaf(d, "apiserver", "/CN=kube-apiserver", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    _leaf(d, "node-serving", "/CN=cwsandbox-node", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _leaf(d, "admin", "/O=system:masters/CN=cwsandbox-admin", client)
    _leaf(d, "controller-manager", "/CN=system:kube-controller-manager", client)
    _leaf(d, "scheduler", "/CN=system:kube-scheduler", client)
    _leaf(d, "node", "/O=cwsandbox:nodes/CN=cwsandbox-node", client)
    _leaf(d, "kubelet-client", "/CN=kube-apiserver-kubelet-client", client)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=d)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    return Pki(d)
