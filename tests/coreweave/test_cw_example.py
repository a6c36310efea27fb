"""examples/coreweave_reward.py, run as a user would, against the test server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
from guards import HANG_GUARD_SECONDS

from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coreweave_reward.py"


async def test_reward_example_runs_on_coreweave() -> None:
    async with CoreWeaveTestServer(api_key="example-key") as server:
        env = {**os.environ, "CWSANDBOX_BASE_URL": server.url, "CWSANDBOX_API_KEY": "example-key"}
        env.pop("WANDB_API_KEY", None)
        with anyio.fail_after(HANG_GUARD_SECONDS):
            proc = await anyio.run_process([sys.executable, str(EXAMPLE)], env=env, check=False)
        out = proc.stdout.decode()
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        assert "rewards: [1.0, 1.0, 0.0, 0.0, 0.0]" in out  # early exit(0) and the endless loop score 0
        assert "active sandboxes: 5" in out
        assert "executions=5 created=5" in out
        assert "early-exit     wrote no /workspace/verdict (exit 0)" in out
        assert "left running: 0" in out
        creates = server.service.calls("CreateSandbox")
        assert len(creates) == 5
        assert {c.sandbox.spec.containers[0].image for c in creates} == {"python:3.11"}
        assert all({"rl-training", "reward-fn"} <= set(c.sandbox.spec.tags) for c in creates)
        assert server.service.live() == []
