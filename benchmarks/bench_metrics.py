"""Per-exec cost of the metrics aggregator.

Measures, in one run:
- ``MetricsAggregator.exec_finished`` against a baseline no-op method with the same
  arguments (the ratio is what the metrics add per exec, in call overhead units);
- ``Sandbox.exec`` on a zero-latency FakeBackend with the real aggregator against the
  same with a no-op aggregator (the share of a full exec that the metrics cost);
- ``log_metrics`` (snapshot + reset + percentiles) with a window of 10,000 execs.

Writes benchmarks/out/metrics.json. ``--quick`` runs fewer iterations.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import anyio

import cwsandbox_async as cwa
from cwsandbox_async._types import ExecOutcome
from cwsandbox_async.metrics._aggregator import MetricsAggregator
from cwsandbox_async.metrics._snapshot import MetricsSnapshot
from cwsandbox_async.testing import FakeBackend

from ._common import write_json


class NoopMetrics(MetricsAggregator):
    def exec_finished(self, *args: Any, **kwargs: Any) -> None:
        pass


def per_call_ns(fn: Any, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(n):
            fn("sbx-0123456789ab", ExecOutcome.COMPLETED_OK, 0.0123, 0.001)
        best = min(best, (time.perf_counter_ns() - t) / n)
    return best


async def exec_rate(metrics: MetricsAggregator, n: int) -> float:
    """Execs per second through Session + Sandbox on a zero-latency FakeBackend."""
    async with cwa.Session(backend=FakeBackend(), report_to=[]) as s:
        s.metrics = metrics
        sb = await s.sandbox()
        sb._metrics = metrics
        best = 0.0
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(n):
                await sb.exec(["true"])
            best = max(best, n / (time.perf_counter() - t))
        return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 20_000 if args.quick else 200_000
    m = MetricsAggregator()
    noop = NoopMetrics()
    baseline_ns = per_call_ns(noop.exec_finished, n)
    metrics_ns = per_call_ns(m.exec_finished, n)

    execs = 2_000 if args.quick else 20_000
    bare_rate = anyio.run(exec_rate, NoopMetrics(), execs)
    full_rate = anyio.run(exec_rate, MetricsAggregator(), execs)

    big = MetricsAggregator()
    for i in range(10_000):
        big.exec_finished(f"sbx-{i % 64}", ExecOutcome.COMPLETED_OK, 0.001 * (1 + i % 997), 0.0)
    t = time.perf_counter()
    snap: MetricsSnapshot = big.snapshot(reset=True)
    snapshot_ms = (time.perf_counter() - t) * 1e3
    assert snap.executions == 10_000

    result = {
        "exec_finished_ns": round(metrics_ns, 1),
        "noop_call_ns": round(baseline_ns, 1),
        "exec_finished_vs_noop_call": round(metrics_ns / baseline_ns, 2),
        "execs_per_s_noop_metrics": round(bare_rate),
        "execs_per_s_with_metrics": round(full_rate),
        "full_exec_rate_ratio": round(full_rate / bare_rate, 3),
        "snapshot_10k_execs_ms": round(snapshot_ms, 3),
        "quick": args.quick,
        "python": sys.version.split()[0],
    }
    result["headline"] = {
        "exec_finished_ns": result["exec_finished_ns"],
        "full_exec_rate_ratio": result["full_exec_rate_ratio"],
    }
    write_json("metrics", result)
    for k, v in result.items():
        print(f"{k:>28}: {v}")


if __name__ == "__main__":
    main()
