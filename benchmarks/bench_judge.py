"""Competitive-programming judging: 64 completions x 20 stdin/stdout cases, half Python, half C++.

Ours: ``Judge(session)`` on the local backend, a fresh sandbox per completion (the default): one
exec per completion writes the source, compiles it (C++: ``g++ -O2``; Python: a syntax check),
and runs the 20 cases, each a fresh process with its own limits; the outputs are compared in the
driver. The baseline is the same judging with plain subprocesses and no isolation, in the same
process and run: per completion, a temporary directory, one ``g++ -O2`` for C++, then one
``subprocess.run`` per case with a timeout, compared the same way. Both sides judge at the same
concurrency (``LIMIT``), run twice in the order baseline, ours, ours, baseline (the machine's
load drifts), and must agree on every case's verdict. A quarter of the completions are
wrong (off by one on some inputs).

    python -m benchmarks.bench_judge [--quick]
"""

from __future__ import annotations

import random
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio

import cwsandbox_async as cwa
from cwsandbox_async.judge import Judge, Limits, TestCase
from cwsandbox_async.judge._compare import compare_text

from ._common import parse_args, write_json

LIMIT = 4
#: The interpreter the sandboxes run (the host's system Python; a pyenv shim on PATH would add ~50 ms a run).
SYSTEM_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
CASES = 20
TIME_LIMIT = 2.0

PY = """import sys
# completion {i}
data = sys.stdin.read().split()
n = int(data[0]); xs = list(map(int, data[1:1 + n]))
total = sum(xs){bug}
print(total)
print(max(xs) if xs else 0)
"""
CPP = """#include <cstdio>
#include <vector>
#include <algorithm>
// completion {i}
int main() {{
    int n; if (scanf("%d", &n) != 1) return 1;
    std::vector<long long> xs(n);
    for (auto &x : xs) scanf("%lld", &x);
    long long total = 0; for (auto x : xs) total += x;{bug}
    printf("%lld\\n%lld\\n", total, xs.empty() ? 0LL : *std::max_element(xs.begin(), xs.end()));
}}
"""


def make_cases(rng: random.Random) -> list[TestCase]:
    cases = []
    for k in range(CASES):
        n = rng.randint(1, 2000 if k % 5 else 20000)
        xs = [rng.randint(-(10**6), 10**6) for _ in range(n)]
        text = f"{n}\n{' '.join(map(str, xs))}\n"
        cases.append(TestCase(text, f"{sum(xs)}\n{max(xs)}\n", name=str(k)))
    return cases


def make_completions(count: int) -> list[tuple[str, str]]:
    out = []
    for i in range(count):
        wrong = i % 4 == 3
        if i % 2 == 0:
            bug = "\nif n % 3 == 0: total += 1" if wrong else ""
            out.append(("python", PY.format(i=i, bug=bug)))
        else:
            bug = "\n    if (n % 3 == 0) total += 1;" if wrong else ""
            out.append(("cpp", CPP.format(i=i, bug=bug)))
    return out


# -- the baseline: plain subprocesses, no isolation -------------------------------------------
def baseline_one(language: str, source: str, cases: list[TestCase]) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        if language == "cpp":
            src, exe = Path(tmp, "main.cpp"), str(Path(tmp, "main"))
            src.write_text(source)
            done = subprocess.run(
                ["g++", "-O2", "-std=gnu++17", "-pipe", "-o", exe, str(src)], capture_output=True, check=False
            )
            if done.returncode != 0:
                return ["compile_error"] * len(cases)
            argv = [exe]
        else:
            src = Path(tmp, "solution.py")
            src.write_text(source)
            argv = [SYSTEM_PYTHON, "-I", str(src)]
        verdicts = []
        for case in cases:
            try:
                run = subprocess.run(
                    argv, input=case.stdin_bytes(), capture_output=True, timeout=TIME_LIMIT * 2 + 1, check=False
                )
            except subprocess.TimeoutExpired:
                verdicts.append("time_limit")
                continue
            if run.returncode != 0:
                verdicts.append("runtime_error")
            else:
                ok = compare_text("whitespace", run.stdout, str(case.expected).encode())
                verdicts.append("accepted" if ok else "wrong_answer")
        return verdicts


def run_baseline(completions: list[tuple[str, str]], cases: list[TestCase]) -> tuple[float, list[list[str]]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(LIMIT) as pool:
        results = list(pool.map(lambda c: baseline_one(c[0], c[1], cases), completions))
    return time.perf_counter() - start, results


# -- ours ----------------------------------------------------------------------------------------
async def run_ours(
    completions: list[tuple[str, str]], cases: list[TestCase]
) -> tuple[float, list[list[str]], dict[str, Any]]:
    async with cwa.Session(backend="local") as session:
        judge = Judge(session, limits=Limits(time_seconds=TIME_LIMIT, memory_mib=256))
        await judge.check_toolchains(["python", "cpp"])  # once, before the clock starts
        results: list[list[str]] = [[] for _ in completions]
        start = time.perf_counter()

        async def one(i: int) -> None:
            language, source = completions[i]
            result = await judge.judge(source, language, cases)
            results[i] = [c.verdict.value for c in result.cases]

        limiter = anyio.CapacityLimiter(LIMIT)

        async def bounded(i: int) -> None:
            async with limiter:
                await one(i)

        async with anyio.create_task_group() as tg:
            for i in range(len(completions)):
                tg.start_soon(bounded, i)
        elapsed = time.perf_counter() - start
        metrics = {k: v for k, v in session.snapshot().as_dict().items() if "judge" in k or k.endswith("/executions")}
    return elapsed, results, metrics


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    count = 16 if args.quick else 64
    rng = random.Random(28)
    cases = make_cases(rng)
    completions = make_completions(count)
    # A B B A: the machine's load drifts; each side runs once early and once late.
    b1, base = run_baseline(completions, cases)
    o1, ours, metrics = anyio.run(run_ours, completions, cases)
    o2, ours2, _ = anyio.run(run_ours, completions, cases)
    b2, base2 = run_baseline(completions, cases)
    assert ours == ours2 and base == base2, "a second run judged differently"
    base_seconds, ours_seconds = (b1 + b2) / 2, (o1 + o2) / 2
    agree = sum(a == b for a, b in zip(base, ours, strict=True))
    accepted = sum(all(v == "accepted" for v in r) for r in ours)
    data = {
        "completions": count,
        "cases_per_completion": CASES,
        "concurrency": LIMIT,
        "baseline_seconds": base_seconds,
        "ours_seconds": ours_seconds,
        "runs": {"baseline": [b1, b2], "ours": [o1, o2]},
        "ratio": ours_seconds / base_seconds,
        "completions_agreeing": agree,
        "all_accepted": accepted,
        "metrics": metrics,
        "headline": {
            "judge_ratio_vs_subprocess": round(ours_seconds / base_seconds, 3),
            "agree": f"{agree}/{count}",
        },
    }
    path = write_json("judge", data)
    print(
        f"judge: {count} completions x {CASES} cases: ours {ours_seconds:.2f} s, plain subprocesses "
        f"{base_seconds:.2f} s, ratio {ours_seconds / base_seconds:.2f}x; {agree}/{count} agree; "
        f"{accepted} fully accepted -> {path}"
    )
    if agree != count:
        raise SystemExit("the judge and the baseline disagree")


if __name__ == "__main__":
    main()
