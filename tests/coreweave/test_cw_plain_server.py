"""The benchmark's plain server (``benchmarks/_plain_server.py``): independent of the project; both clients use it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async.backends.coreweave import CoreWeaveBackend
from cwsandbox_async.testing.contract import make_request, make_spec

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "benchmarks" / "_plain_server.py"
SDK_EXEC = """
import json, sys
from cwsandbox import SandboxDefaults, Session
with Session(SandboxDefaults(container_image="python:3.11"), report_to=[]) as s:
    sb = s.sandbox()
    r = sb.exec(["true"], timeout_seconds=30).result()
    json.dump([r.returncode, r.stdout], sys.stdout)
"""


@pytest.fixture
def plain_url() -> Iterator[str]:
    argv = [sys.executable, "-m", "benchmarks._plain_server"]
    with subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:"), url
            yield url
        finally:
            proc.stdin.close()  # it serves until its stdin closes
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_it_imports_nothing_of_the_project() -> None:
    """It shares no code with the project's test server: only grpc, protobuf, the stdlib and the SDK's protocol."""
    tree = ast.parse(SERVER.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module is not None
            roots.add(node.module.split(".")[0])
    assert roots <= {
        "__future__",
        "asyncio",
        "itertools",
        "sys",
        "threading",
        "time",
        "typing",
        "grpc",
        "cwsandbox",
        "google",
    }


async def test_this_library_and_the_sdk_exec_on_it(plain_url: str) -> None:
    backend = CoreWeaveBackend(base_url=plain_url, ready_poll_seconds=0.02)
    try:
        spec = make_spec("plain")
        await backend.create(spec)
        for _ in range(2):
            r = await backend.exec(spec.sandbox_id, make_request("true"))
            assert (r.returncode, r.stdout) == (0, b"ok\n")  # ready, one output frame, exit
        assert backend.channel is not None and backend.channel.unary_exec is False  # it serves only the SDK's RPCs
        assert backend.channel.calls["Exec"] == 1 and backend.channel.calls["StreamExec"] == 2
        await backend.destroy(spec.sandbox_id)
    finally:
        await backend.aclose()
    env = {
        **os.environ,
        "CWSANDBOX_BASE_URL": plain_url,
        "CWSANDBOX_API_KEY": "k",
        "CWSANDBOX_DISABLE_SIGNAL_HANDLERS": "1",
    }
    with anyio.fail_after(HANG_GUARD_SECONDS):
        sdk = await anyio.run_process([sys.executable, "-c", SDK_EXEC], env=env, check=False)
    assert sdk.returncode == 0, sdk.stderr.decode()[-3000:]
    assert json.loads(sdk.stdout) == [0, "ok\n"]
