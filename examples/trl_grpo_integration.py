"""TRL GRPOTrainer with rewards computed in cwsandbox_async sandboxes.

The reward function comes from ``cwsandbox_async.integrations.trl``: it takes the
code out of each completion (``<answer>...</answer>`` or a python fence), appends
the row's tests (the dataset's ``tests`` column reaches it as a reward kwarg), runs
it in a sandbox leased from a warm pool, and returns 1.0 / 0.0 (``None`` when a
completion has no code). TRL runs the async reward on its own event loop thread,
where the Session and pool live for the whole run; each call prints a
``[CWSandbox] Reward call N: ...`` line and logs the sandbox metrics at the step.

Offline (default): a tiny randomly initialised Qwen2-style model with a tokenizer
trained on the spot, CPU only, 2 steps in well under a minute. Its vocabulary
includes a few whole candidate answers as single tokens and generation is limited
to those (plus end-of-text), so the sandboxes see real code, some of it right:

    python examples/trl_grpo_integration.py
    python examples/trl_grpo_integration.py --sync          # the sync reward (one persistent loop thread)
    WANDB_MODE=offline python examples/trl_grpo_integration.py --report-to wandb   # an offline W&B run

Where the numbers go with ``--report-to wandb``: TRL logs the rewards
(``train/rewards/sandbox_tests/mean``) and the values the reward passes to its
``log_metric`` (``train/cwsandbox/sandbox_tests/pass_rate``, ``.../timeouts``, ...) at
``train/global_step``; the session's sandbox metrics (``cwsandbox/sandbox_tests/*``:
execs, latencies, timeouts, OOM kills) are logged at ``cwsandbox/step``, the same
step numbers.

With a real model (needs the Hub or a local copy):

    python examples/trl_grpo_integration.py --model Qwen/Qwen2.5-0.5B-Instruct --max-steps 10

Needs ``pip install 'cwsandbox-async[trl]'`` (trl, transformers, datasets, torch).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from typing import Any

OFFLINE_HELP = """offline (a tiny random model, CPU only, under a minute):
  python examples/trl_grpo_integration.py
with an offline W&B run (no key needed):
  WANDB_MODE=offline python examples/trl_grpo_integration.py --report-to wandb
"""

SYSTEM_PROMPT = (
    "You solve coding problems by writing Python code. Put the code inside <answer> tags, "
    "like <answer>def f(x): return x</answer>. Only include the code."
)

TASKS = [
    ("Write a function add(a, b) that returns the sum of a and b.", "assert add(2, 3) == 5\nassert add(-1, 1) == 0"),
    ("Write a function mul(a, b) that returns the product of a and b.", "assert mul(2, 3) == 6\nassert mul(0, 7) == 0"),
    ("Write a function neg(x) that returns -x.", "assert neg(4) == -4"),
    ("Write a function square(x) that returns x * x.", "assert square(3) == 9"),
]

#: The offline model can only emit these whole answers (one token each), or end the completion.
CANDIDATE_ANSWERS = [
    "<answer>def add(a, b): return a + b</answer>",
    "<answer>def add(a, b): return a - b</answer>",
    "<answer>def mul(a, b): return a * b</answer>",
    "<answer>def mul(a, b): return a + b</answer>",
    "<answer>def neg(x): return -x</answer>",
    "<answer>def square(x): return x * x</answer>",
    "<answer>def square(x): return x ** 3</answer>",
    "I do not know.",
]


def tiny_offline_model() -> tuple[Any, Any, list[int]]:
    """A 14k-parameter random Qwen2 model, a byte-level BPE tokenizer trained here, and the token ids to suppress."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [SYSTEM_PROMPT, *[t for t, _ in TASKS], *CANDIDATE_ANSWERS] * 20
    raw.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_tokens(CANDIDATE_ANSWERS)
    allowed = {tok.convert_tokens_to_ids(a) for a in CANDIDATE_ANSWERS} | {tok.eos_token_id}
    suppress = [i for i in range(len(tok)) if i not in allowed]

    import torch

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    return Qwen2ForCausalLM(config), tok, suppress


def main() -> int:
    parser = argparse.ArgumentParser(
        description="TRL GRPO with rewards from cwsandbox_async sandboxes",
        epilog=OFFLINE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default=None, help="a model name or path (default: tiny offline model)")
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--backend", default="local", choices=["local", "kubernetes", "coreweave"])
    parser.add_argument("--sync", action="store_true", help="use the sync reward function (persistent loop thread)")
    parser.add_argument("--output-dir", default=None)
    parser.add_argument(
        "--report-to",
        choices=["none", "wandb"],
        default="none",
        help="where TRL and the sandbox metrics go (wandb: the trainer's run; WANDB_MODE=offline needs no key)",
    )
    args = parser.parse_args()

    if args.model is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")  # with weave installed (ART), wandb.init may prompt for a key
    # TRL 1.16 calls transformers' deprecated is_gradient_checkpointing: not this example's to fix
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        print(f"Missing dependency: {exc}\nInstall: pip install 'cwsandbox-async[trl]'")
        return 1
    from cwsandbox_async.integrations.trl import code_reward, code_reward_sync

    started = time.monotonic()
    generation_kwargs: dict[str, Any] = {}
    if args.model is None:
        model, tokenizer, suppress = tiny_offline_model()
        generation_kwargs["suppress_tokens"] = suppress
        generation_kwargs["begin_suppress_tokens"] = [tokenizer.eos_token_id]  # at least one answer per completion
        print(f"Model: tiny random Qwen2 ({sum(p.numel() for p in model.parameters())} parameters), offline")
        max_completion_length = 4
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model)
        print(f"Model: {args.model}")
        max_completion_length = 256

    dataset = Dataset.from_dict(
        {
            "prompt": [f"{SYSTEM_PROMPT}\n\n{task}\n" for task, _ in TASKS],
            "tests": [tests for _, tests in TASKS],  # reaches the reward function as tests=[...]
        }
    )
    make = code_reward_sync if args.sync else code_reward
    reward = make(
        name="sandbox_tests",
        tests_column="tests",
        timeout_seconds=10,
        pool_size=4,
        backend=args.backend,
        defaults={"tags": ("example:trl-grpo",)},
        report_to=None if args.report_to == "wandb" else [],  # None: the trainer's W&B run, once TRL opened it
    )
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="trl-grpo-")
    config = GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=max_completion_length,
        max_steps=args.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to=args.report_to,
        generation_kwargs=generation_kwargs or None,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=[reward], args=config, train_dataset=dataset
    )
    print(f"Training {args.max_steps} steps ({'sync' if args.sync else 'async'} reward)...")
    trainer.train()
    for entry in trainer.state.log_history:
        if "reward" in entry:
            mean = entry.get("rewards/sandbox_tests/mean", float("nan"))
            print(f"step {entry.get('step')}: reward {entry['reward']:.3f} (sandbox_tests mean {mean:.3f})")
    reward.close()  # stops the sandboxes; their teardown metrics go to the run too
    if args.report_to == "wandb":
        import wandb

        if wandb.run is not None:
            print(f"W&B run: {wandb.run.settings.sync_file}")
            wandb.run.finish()
    print(f"Completed {trainer.state.global_step} steps in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
