"""TRL's GRPOTrainer with two sandbox rewards, reporting to a real offline W&B run, read back.

What a TRL user sees in W&B: the rewards TRL logs at ``train/global_step`` N and
the sandbox metrics of the programs scored for them at ``cwsandbox/step`` N, each
reward under its own ``cwsandbox/<name>/*`` names, and no trailing row of zeros.
Runs the trainer in a subprocess (as a user would) on the tiny offline model of
``examples/trl_grpo_integration.py``; marked ``integration`` (needs the trl extra).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NEEDS = ("trl", "transformers", "datasets", "torch", "tokenizers", "wandb")

SCRIPT = """
import os, sys
sys.path.insert(0, {examples!r})
os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
import wandb
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl_grpo_integration import SYSTEM_PROMPT, TASKS, tiny_offline_model
from cwsandbox_async.integrations.trl import code_reward, code_reward_sync

model, tokenizer, suppress = tiny_offline_model()
dataset = Dataset.from_dict(
    {{"prompt": [f"{{SYSTEM_PROMPT}}\\n\\n{{t}}\\n" for t, _ in TASKS], "tests": [tests for _, tests in TASKS]}}
)
make = code_reward_sync if {sync!r} else code_reward
rewards = [
    make(name="unit_tests", tests_column="tests", timeout_seconds=10, pool_size=2),
    make(name="runs_at_all", timeout_seconds=10, pool_size=2),  # no tests: does the code run?
]
config = GRPOConfig(
    output_dir={out!r}, use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=2,
    max_completion_length=4, max_steps=3, logging_steps=1, save_strategy="no", report_to="wandb",
    generation_kwargs={{"suppress_tokens": suppress, "begin_suppress_tokens": [tokenizer.eos_token_id]}},
)
trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=rewards, args=config, train_dataset=dataset)
trainer.train()
print("SYNC", wandb.run.settings.sync_file)
for r in rewards:
    r.close()  # the close flush (the pools' teardown) goes to the run too
wandb.run.finish()
"""


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("form", ["async", "sync"])
def test_sandbox_metrics_of_step_n_land_at_step_n_per_reward(tmp_path: Path, form: str) -> None:
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs the trl extra (missing: {', '.join(missing)})")
    script = SCRIPT.format(examples=str(ROOT / "examples"), sync=form == "sync", out=str(tmp_path / "out"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WANDB")},
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_PROJECT": "cwsandbox-async-test",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540, check=False
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    from wandb_reader import read_history  # imports wandb's protobufs

    # what each reward call ran, from its printed line (calls 1..3 are steps 1..3)
    ran: dict[str, dict[int, int]] = defaultdict(dict)
    for call, name, n in re.findall(r"^\[CWSandbox\] Reward call (\d+) \((\w+)\): (\d+) sandboxes", proc.stdout, re.M):
        ran[name][int(call)] = int(n)
    assert set(ran) == {"unit_tests", "runs_at_all"} and all(len(v) == 3 for v in ran.values()), proc.stdout

    sync_file = next(line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("SYNC "))
    history = read_history(sync_file)
    for name in ("unit_tests", "runs_at_all"):
        trl_steps = [row["train/global_step"] for row in history if f"train/rewards/{name}/mean" in row]
        ours = {
            row["cwsandbox/step"]: row[f"cwsandbox/{name}/executions"]
            for row in history
            if f"cwsandbox/{name}/executions" in row
        }
        assert trl_steps == [1, 2, 3], trl_steps
        assert ours == ran[name], (name, ours, ran[name])  # step N's programs at cwsandbox/step N, no zero row after
        teardown = [row for row in history if f"cwsandbox/{name}/teardown/sandboxes_destroyed" in row]
        assert [row["cwsandbox/step"] for row in teardown] == [3]  # the pool's teardown joins the last step
    assert not [key for row in history for key in row if re.fullmatch(r"cwsandbox/(executions|sandboxes_created)", key)]
