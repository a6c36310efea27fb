"""The unmodified ``cwsandbox`` SDK against the test server: it speaks the protocol the real client speaks.

The SDK runs in a subprocess (its own background loop thread must not share the test's
loop or outlive the test); ``sdk_client.py`` drives its documented calls: create, exec
(plain, non-zero, stdin, streamed), write/read, a missing file, list by tag, stop.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
from guards import HANG_GUARD_SECONDS

from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

CLIENT = Path(__file__).with_name("sdk_client.py")


async def test_unmodified_sdk_runs_its_documented_calls() -> None:
    async with CoreWeaveTestServer(api_key="sdk-key") as server:
        env = {
            **os.environ,
            "CWSANDBOX_BASE_URL": server.url,
            "CWSANDBOX_API_KEY": "sdk-key",
            "CWSANDBOX_DISABLE_SIGNAL_HANDLERS": "1",
        }
        with anyio.fail_after(HANG_GUARD_SECONDS):
            proc = await anyio.run_process([sys.executable, str(CLIENT)], env=env, check=False)
        assert proc.returncode == 0, proc.stderr.decode()[-4000:]
        out = json.loads(proc.stdout)
        sid = out["sandbox_id"]
        assert out["exec"] == [0, "hello from the sdk\n"]
        assert out["exec_nonzero"] == [3, "err"]
        assert out["exec_stdin"] == "piped\n"
        assert "".join(out["exec_stream"]) == "one\ntwo\n"
        assert out["read_back"] is True
        assert out["missing"] == ["SandboxFileError", "/workspace/missing.txt"]
        assert out["listed"] == [sid]
        assert out["status"] == "running"
        assert out["exec_stats"]["exec_count"] == 4
        assert out["stopped_status"] == "completed"
        assert out["listed_after_stop"] == []
        # what the server saw: the SDK's own calls, authenticated, on real sandboxes now gone
        service = server.service
        methods = {r.method for r in service.requests}
        assert {"CreateSandbox", "GetSandbox", "StreamExec", "WriteFile", "ReadFile", "ListSandboxes"} <= methods
        assert "DeleteSandbox" in methods
        assert all(r.metadata.get("authorization") == "Bearer sdk-key" for r in service.requests if r.metadata)
        (create,) = service.calls("CreateSandbox")
        assert create.request_id
        assert create.sandbox.spec.containers[0].image == "python:3.11"
        assert list(create.sandbox.spec.tags) == ["sdk-test"]
        assert service.live() == []
