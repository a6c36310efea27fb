"""The judge on a pool's leases, and its verdict counts in a real (offline) W&B run, read back from the run's log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.judge import Judge, Limits, TestCase

TESTS_DIR = str(Path(__file__).resolve().parent.parent)
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
CASES = [TestCase("1 1\n", "2\n"), TestCase("2 2\n", "4\n"), TestCase("3 3\n", "7\n")]


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("wandb")
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_X_DISABLE_STATS": "true",
        "WANDB_X_DISABLE_MACHINE_INFO": "true",
    }.items():
        monkeypatch.setenv(key, value)
    return tmp_path


async def test_judging_on_a_pool_lands_per_verdict_in_wandb(offline: Path, local_backend: None) -> None:
    import wandb

    sys.path.insert(0, TESTS_DIR)
    from wandb_reader import read_history

    run = wandb.init(project="cwsandbox-async-test", reinit="create_new")
    try:
        async with cwa.Session(backend="local", run=run) as session, cwa.SandboxPool(session, size=2) as pool:
            judge = Judge(session, pool=pool, limits=Limits(time_seconds=1, memory_mib=128))
            for _ in range(2):
                result = await judge.judge(ADD, "python", CASES)  # each on a lease of the pool
                assert [c.verdict.value for c in result.cases] == ["accepted", "accepted", "wrong_answer"]
            assert session.log_metrics(step=1)
        path = run.settings.sync_file
    finally:
        run.finish()
    rows = [row for row in read_history(path) if row.get("cwsandbox/step") == 1]
    assert rows, "no row at step 1"
    row = rows[0]
    assert row["cwsandbox/judge_accepted"] == 4
    assert row["cwsandbox/judge_wrong_answer"] == 2
    assert row["cwsandbox/judge_completions"] == 2
    assert row["cwsandbox/judge_completion_wrong_answer"] == 2
    assert row["cwsandbox/leases"] >= 2
