"""A cluster leaves nothing behind: no process (components and pod sandboxes), no port, no directory.

These start their own small cluster (one node), beside the session's, and count what is left.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from guards import HANG_GUARD_SECONDS

from .build import locate
from .cluster import Cluster, ClusterStartError, _alive, descendants
from .plugin import skip_reason

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def _built() -> None:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_stop_leaves_no_process_port_or_directory() -> None:
    c = Cluster(locate(), nodes=(("solo", True),), die_with_parent=True)
    try:
        c.start()
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "left", "namespace": "default"},
            "spec": {"nodeName": "solo", "automountServiceAccountToken": False, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "x", "command": ["sleep", "3600"]}]},
        }  # fmt: skip
        c.kubectl("create", "-f", "-", input=json.dumps(pod), check=True)
        end = time.monotonic() + HANG_GUARD_SECONDS
        while c.kubectl("get", "pod", "left", "-o", "jsonpath={.status.phase}").stdout != "Running":
            assert time.monotonic() < end, "the pod did not run"
            time.sleep(0.2)
        # an exec'd process that outlives its exec, too
        c.kubectl("exec", "left", "--", "sh", "-c", "sleep 3601 >/dev/null 2>&1 &", check=True)
        pids = set(c.pids())
        for p in list(pids):
            pids |= descendants(p)
        assert len(pids) >= 5 + 3  # five components, the pod's bwrap + PID 1, the background sleep
        ports = list(c.ports.values())
        workdir = c.dir
        assert any(listening(p) for p in ports)
    finally:
        c.stop()
    assert [p for p in pids if _alive(p)] == []
    assert [p for p in ports if listening(p)] == []
    assert not workdir.exists()


def test_a_failed_start_stops_what_it_started() -> None:
    c = Cluster(locate(), apiserver_args=("--no-such-flag",), die_with_parent=True)
    with pytest.raises(ClusterStartError, match="kube-apiserver exited") as err:
        c.start()
    assert "unknown flag: --no-such-flag" in str(err.value)
    assert c.components == []
    assert c.workdir is not None and not c.workdir.exists()


def test_the_cluster_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A test runner killed with SIGKILL (no teardown at all) takes its cluster with it."""
    script = (
        "import sys, time; sys.path.insert(0, sys.argv[1]);"
        "from cluster.cluster import Cluster; from cluster.build import locate;"
        "from pathlib import Path;"
        "c = Cluster(locate(), nodes=(('orphan', False),), die_with_parent=True, workdir=Path(sys.argv[2]));"
        "c.start(); print(' '.join(map(str, c.pids())), flush=True); time.sleep(600)"
    )  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    runner = subprocess.Popen([sys.executable, "-c", script, str(Path(__file__).parent.parent), str(work)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert runner.stdout is not None
        line = runner.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 5, line
    finally:
        runner.kill()
        runner.wait(30)
        if runner.stdout is not None:
            runner.stdout.close()
    end = time.monotonic() + HANG_GUARD_SECONDS
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []
