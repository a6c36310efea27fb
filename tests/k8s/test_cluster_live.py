"""The live suite (``test_live.py``, as a user runs it against their cluster) against the real control plane.

It runs in a pytest of its own with ``CWSANDBOX_K8S_LIVE`` set to a kubeconfig of a ServiceAccount
bound to the docs' Role, plus ``pods/eviction`` (the suite evicts a pod, the backend never does).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

from .real import ROOT, docs_rbac, tenant

#: The only skips the live suite may report on Kubernetes: the contract's attach checks (not offered yet).
ATTACH_SKIP = re.compile(r"cannot attach|no peer backend")


def _with_eviction(ns: str) -> list[dict[str, Any]]:
    docs = docs_rbac(ns)
    role = next(d for d in docs if d["kind"] == "Role")
    role["rules"].append({"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]})
    return docs


async def test_the_live_suite_passes_on_the_real_cluster(real_cluster: Any, tmp_path: Path) -> None:
    async with tenant(real_cluster, rbac=_with_eviction) as t:
        kubeconfig = t.write_kubeconfig(tmp_path / "sa.kubeconfig")
        env = {**os.environ, "CWSANDBOX_K8S_LIVE": str(kubeconfig), "CWSANDBOX_K8S_IMAGE": "cwsandbox/python:3"}
        argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-m", "live_k8s", "tests/k8s/test_live.py"]
        with anyio.fail_after(280):
            proc = await anyio.run_process(argv, cwd=ROOT, env=env, check=False, stderr=subprocess.STDOUT)
        out = proc.stdout.decode(errors="replace")
        assert proc.returncode == 0, out[-4000:]
        passed = re.search(r"(\d+) passed", out)
        assert passed and int(passed.group(1)) >= 19, out[-2000:]
        # every contract check runs but attach, which this backend does not offer yet (SandboxNotSupportedError)
        skips = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", out, re.MULTILINE)
        assert all(ATTACH_SKIP.search(reason) for reason in skips), skips
        await t.wait_no_pods()
