"""Build the test cluster's binaries from the Go module proxy into a cache outside the work tree.

``python tests/cluster/build.py`` (what ``make build-cluster`` runs) builds, with the local Go
toolchain (``GOTOOLCHAIN=local``, CGO off, ``-trimpath``):

- kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from ``k8s.io/kubernetes``
  at the version pinned in ``tests/cluster/bins/go.mod`` (each ``k8s.io/*`` staging module
  replaced by its published tag), version-stamped as the release is;
- etcd from ``go.etcd.io/etcd/server/v3`` at the version in ``tests/cluster/etcd/go.mod``;
- the node, ``tests/cluster/bins/node`` (virtual-kubelet + bubblewrap sandboxes), in the same module
  as the control plane: one dependency graph, so the node reuses every package the control plane
  compiled (as a module of its own, with virtual-kubelet's newer x/net, x/sys, grpc and otel, it
  recompiled most of them: 24 minutes cold instead of a few).

into ``$CWSANDBOX_K8S_CACHE`` (default ``~/.cache/cwsandbox-k8s``)::

    <k8s-version>-<etcd-version>-<hash of the go.mod/go.sum files and the Go version>/bin/
    node-<hash of the node's sources and the Go version>/bin/cwsandbox-node

A directory that exists is complete (each build goes to a temporary directory renamed at the
end), so only a changed version or source is rebuilt. The first build downloads ~1 GB of
modules and compiles ~3,000 packages: about half an hour on 2 cores (see README, "The cluster
tier"); later builds reuse Go's build cache. Exits non-zero with Go's output when a build fails.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Binaries", "build", "locate"]

HERE = Path(__file__).resolve().parent
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
GO_ENV = {"GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}


@dataclass(frozen=True)
class Binaries:
    """Where the pinned binaries live (``bin`` holds the control plane, ``node`` the node program)."""

    k8s_version: str
    etcd_version: str
    bin: Path
    node: Path

    def path(self, name: str) -> Path:
        return self.node if name == "cwsandbox-node" else self.bin / name

    def missing(self) -> list[str]:
        return [n for n in (*CONTROL_PLANE, "etcd", "cwsandbox-node") if not self.path(n).is_file()]


def cache_root() -> Path:
    return Path(os.environ.get("CWSANDBOX_K8S_CACHE", Path.home() / ".cache" / "cwsandbox-k8s"))


def _required(gomod: Path, module: str) -> str:
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod.read_text(), re.M)
    if m is None:
        raise RuntimeError(f"{gomod} does not require {module}")
    return m.group(1)


def _go_version() -> str:
    go = shutil.which("go")
    if go is None:
        return "no-go"
    out = subprocess.run([go, "version"], capture_output=True, text=True, timeout=60, check=False)
    return out.stdout.strip()


def _digest(paths: list[Path], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for p in sorted(paths):
        h.update(str(p.relative_to(HERE)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:10]


def _ldflags(k8s: str) -> str:
    major, minor = k8s.lstrip("v").split(".")[:2]
    x = {
        "k8s.io/component-base/version.gitVersion": k8s,
        "k8s.io/component-base/version.gitMajor": major,
        "k8s.io/component-base/version.gitMinor": minor,
        "k8s.io/component-base/version.gitCommit": "0" * 40,
        "k8s.io/component-base/version.gitTreeState": "clean",
        "k8s.io/client-go/pkg/version.gitVersion": k8s,
    }
    return "-s -w " + " ".join(f"-X {k}={v}" for k, v in x.items())


def locate(go_version: str | None = None) -> Binaries:
    """Where the binaries for the current sources are (or will be); does not build."""
    gv = go_version if go_version is not None else _go_version()
    k8s = _required(HERE / "bins" / "go.mod", "k8s.io/kubernetes")
    etcd = _required(HERE / "etcd" / "go.mod", "go.etcd.io/etcd/server/v3")
    cp_files = [HERE / d / f for d in ("bins", "etcd") for f in ("go.mod", "go.sum")]
    cp_key = _digest(cp_files, gv + _ldflags(k8s))
    node_files = [*(HERE / "bins" / "node").glob("*.go"), HERE / "bins" / "go.mod", HERE / "bins" / "go.sum"]
    node_key = _digest(node_files, gv)
    root = cache_root()
    node = root / f"node-{node_key}" / "bin" / "cwsandbox-node"
    if os.environ.get("CWSANDBOX_CLUSTER_NODE_BIN"):  # a node built by hand, while working on it
        node = Path(os.environ["CWSANDBOX_CLUSTER_NODE_BIN"])
    return Binaries(k8s, etcd, root / f"{k8s}-{etcd}-{cp_key}" / "bin", node)


def _go(args: list[str], cwd: Path) -> None:
    env = {**os.environ, **GO_ENV}
    print(f"  $ (cd {cwd.relative_to(HERE.parent.parent)} && go {' '.join(args)})", flush=True)
    subprocess.run(["go", *args], cwd=cwd, env=env, check=True)


def _step(what: str, target_dir: Path, build_into: Callable[[Path], None]) -> None:
    """Build into a temporary sibling of target_dir, then rename it into place."""
    if target_dir.is_dir():
        print(f"{what}: up to date in {target_dir}", flush=True)
        return
    tmp = target_dir.with_name(target_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(f"{what}: building into {target_dir} ...", flush=True)
    t0 = time.monotonic()
    try:
        build_into(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(target_dir)
    print(f"{what}: built in {time.monotonic() - t0:.0f} s", flush=True)


def build() -> Binaries:
    """Build what is missing and return where everything is. Raises on a failed build."""
    if shutil.which("go") is None:
        raise RuntimeError("go is not on PATH: the cluster tier needs Go (1.26) to build its binaries")
    bins = locate()
    print(
        f"cluster binaries: Kubernetes {bins.k8s_version}, etcd {bins.etcd_version}, {_go_version()}\n"
        f"cache: {cache_root()} (a cold build takes ~30 min on 2 cores; later builds minutes or nothing)",
        flush=True,
    )
    cp_dir = bins.bin.parent

    def control_plane(tmp: Path) -> None:
        out = tmp / "bin"
        out.mkdir()
        pkgs = [f"k8s.io/kubernetes/cmd/{n}" for n in CONTROL_PLANE]
        _go(["build", "-trimpath", "-ldflags", _ldflags(bins.k8s_version), "-o", f"{out}/", *pkgs], HERE / "bins")
        _go(
            ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"],
            HERE / "etcd",
        )

    def node(tmp: Path) -> None:
        out = tmp / "bin"
        out.mkdir()
        _go(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "cwsandbox-node"), "./node"], HERE / "bins")

    t0 = time.monotonic()
    _step(
        "control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd)", cp_dir, control_plane
    )
    _step("node (cwsandbox-node)", bins.node.parent.parent, node)
    missing = bins.missing()
    if missing:
        raise RuntimeError(f"built, but these are missing: {', '.join(missing)}")
    print(f"done in {time.monotonic() - t0:.0f} s\nbin: {bins.bin}\nnode: {bins.node}", flush=True)
    return bins


def main() -> int:
    if sys.argv[1:] == ["--locate"]:
        b = locate()
        print(b.bin if not b.missing() else "")
        return 0
    try:
        build()
    except subprocess.CalledProcessError as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
