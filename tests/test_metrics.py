"""The metrics aggregator, its histogram, snapshots and the flush path (no W&B here; see test_wandb)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import structlog
from guards import HANG_GUARD_SECONDS
from hypothesis import given, settings
from hypothesis import strategies as st

import cwsandbox_async as cwa
from cwsandbox_async._types import ExecOutcome
from cwsandbox_async.metrics._aggregator import MetricsAggregator
from cwsandbox_async.metrics._histogram import DEFAULT_RELATIVE_ERROR, MAX_BINS, QuantileSketch
from cwsandbox_async.metrics._snapshot import MetricsSnapshot
from cwsandbox_async.reporters import LogReporter
from cwsandbox_async.testing import FakeBackend, Faults, Latency

COREWEAVE_NAMES = [
    "cwsandbox/sandboxes_created",
    "cwsandbox/executions",
    "cwsandbox/exec_completed_ok",
    "cwsandbox/exec_completed_nonzero",
    "cwsandbox/exec_failures",
    "cwsandbox/exec_completion_rate",
    "cwsandbox/exec_failure_rate",
    "cwsandbox/startup_count",
    "cwsandbox/avg_startup_seconds",
    "cwsandbox/min_startup_seconds",
    "cwsandbox/max_startup_seconds",
    "cwsandbox/avg_execs_per_sandbox",
    "cwsandbox/min_execs_per_sandbox",
    "cwsandbox/max_execs_per_sandbox",
]
#: The histogram's stated bound, plus float noise.
REL_ERR = DEFAULT_RELATIVE_ERROR + 1e-9


def exact_quantile(values: list[float], q: float) -> float:
    """The definition the sketch approximates (DDSketch's): the value of rank floor(q * (n - 1))."""
    return sorted(values)[math.floor(q * (len(values) - 1))]


def assert_quantiles(metrics: dict[str, Any], name: str, values: list[float]) -> None:
    for q, suffix in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
        got, want = metrics[f"cwsandbox/{name}_{suffix}"], exact_quantile(values, q)
        assert abs(got - want) <= REL_ERR * want, (name, suffix, got, want)


# -- a known workload on FakeBackend (test_wandb replays it through a real run) --------
@dataclass
class Expected:
    """What each flush of ``workload`` must contain (step -> exact values) and its raw samples."""

    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    startup: list[float] = field(default_factory=list)
    exec_wall: list[float] = field(default_factory=list)
    absent: dict[int, list[str]] = field(default_factory=dict)
    #: The close flush: only teardown happened after step 4, so it goes out at step 4 as cwsandbox/teardown/*.
    teardown: dict[str, float] = field(default_factory=dict)


def make_backend() -> FakeBackend:
    return FakeBackend(seed=7, create_latency=Latency.uniform(0.005, 0.03), exec_latency=Latency.lognormal(0.001, 0.01))


async def workload(session: cwa.Session, backend: FakeBackend, flushed: list[bool]) -> Expected:
    """Steps 0..4 through ``log_metrics`` (step 3 with reset=False); the close adds step 4's teardown."""
    exp = Expected()
    sbs = [await session.sandbox() for _ in range(3)]
    exp.startup = [sb.startup_seconds for sb in sbs]

    async def run(sb: cwa.Sandbox, commands: list[list[str]]) -> None:
        for argv in commands:
            exp.exec_wall.append((await sb.exec(argv)).wall_seconds)

    async def timeout(sb: cwa.Sandbox) -> None:
        with pytest.raises(cwa.SandboxTimeoutError) as info:
            await sb.exec(["sleep", "5"], timeout_seconds=0.05)
        assert info.value.result is not None
        exp.exec_wall.append(info.value.result.wall_seconds)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, sbs[0], [["true"]] * 60)
        tg.start_soon(run, sbs[1], [["true"]] * 20 + [["exit", "3"]] * 10)
        tg.start_soon(run, sbs[2], [["false"]] * 10)
        tg.start_soon(timeout, sbs[2])
    exp.steps[0] = {
        "cwsandbox/sandboxes_created": 3,
        "cwsandbox/executions": 101,
        "cwsandbox/exec_completed_ok": 80,
        "cwsandbox/exec_completed_nonzero": 20,
        "cwsandbox/exec_failures": 1,
        "cwsandbox/exec_completion_rate": 80 / 101,
        "cwsandbox/exec_failure_rate": 1 / 101,
        "cwsandbox/startup_count": 3,
        "cwsandbox/avg_startup_seconds": sum(exp.startup) / 3,
        "cwsandbox/min_startup_seconds": min(exp.startup),
        "cwsandbox/max_startup_seconds": max(exp.startup),
        "cwsandbox/avg_execs_per_sandbox": 101 / 3,
        "cwsandbox/min_execs_per_sandbox": 11,
        "cwsandbox/max_execs_per_sandbox": 60,
        "cwsandbox/exec_timeouts": 1,
        "cwsandbox/exec_infra_failures": 0,
        "cwsandbox/infra_failure_rate": 0.0,
        "cwsandbox/sandboxes_destroyed": 0,
        "cwsandbox/sandboxes_live": 3,
        "cwsandbox/create_failures": 0,
    }
    flushed.append(session.log_metrics(step=0))

    # step 1: infrastructure failures, a failed create, a stop; no startups (so no startup stats)
    backend.faults = Faults(exec_transport_error=1.0)
    for _ in range(2):
        with pytest.raises(cwa.SandboxTransportError):
            await sbs[0].exec(["true"])
    backend.faults = Faults(create_failure=1.0)
    with pytest.raises(cwa.SandboxCreationError):
        await session.sandbox()
    backend.faults = Faults()
    await sbs[2].stop()
    await sbs[1].exec(["true"])
    exp.steps[1] = {
        "cwsandbox/sandboxes_created": 1,
        "cwsandbox/create_failures": 1,
        "cwsandbox/executions": 3,
        "cwsandbox/exec_completed_ok": 1,
        "cwsandbox/exec_completed_nonzero": 0,
        "cwsandbox/exec_failures": 2,
        "cwsandbox/exec_infra_failures": 2,
        "cwsandbox/exec_completion_rate": 1 / 3,
        "cwsandbox/exec_failure_rate": 2 / 3,
        "cwsandbox/infra_failure_rate": 3 / 4,
        "cwsandbox/avg_execs_per_sandbox": 1.5,
        "cwsandbox/min_execs_per_sandbox": 1,
        "cwsandbox/max_execs_per_sandbox": 2,
        "cwsandbox/sandboxes_destroyed": 1,
        "cwsandbox/sandboxes_live": 2,
    }
    exp.absent[1] = ["cwsandbox/startup_count", "cwsandbox/avg_startup_seconds", "cwsandbox/startup_seconds_p50"]
    flushed.append(session.log_metrics(step=1))

    # step 2 (step=None: last + 1), then 3 with reset=False and 4 that still includes 3's exec
    await sbs[0].exec(["true"])
    flushed.append(session.log_metrics())
    exp.steps[2] = {"cwsandbox/executions": 1, "cwsandbox/exec_completed_ok": 1, "cwsandbox/sandboxes_created": 0}
    await sbs[0].exec(["false"])
    flushed.append(session.log_metrics(step=3, reset=False))
    exp.steps[3] = {"cwsandbox/executions": 1, "cwsandbox/exec_completed_nonzero": 1}
    await sbs[1].exec(["true"])
    flushed.append(session.log_metrics(step=4))
    exp.steps[4] = {
        "cwsandbox/executions": 2,
        "cwsandbox/exec_completed_ok": 1,
        "cwsandbox/exec_completed_nonzero": 1,
        "cwsandbox/avg_execs_per_sandbox": 1.0,
    }
    # the close flush: the two stops and nothing else, so no step 5 row of zeros but step 4's teardown
    exp.teardown = {"cwsandbox/teardown/sandboxes_destroyed": 2, "cwsandbox/teardown/sandboxes_live": 0}
    return exp


def check_teardown(row: dict[str, Any], exp: Expected) -> None:
    """Only teardown names, under cwsandbox/teardown/: nothing that would chart a zero for step 4."""
    for name, want in exp.teardown.items():
        assert row[name] == want, (name, row[name], want)
    names = {k for k in row if k.startswith("cwsandbox/") and k != "cwsandbox/step"}
    assert names and all(k.startswith("cwsandbox/teardown/") for k in names), sorted(names)
    assert "cwsandbox/teardown/sandbox_seconds" in names and "cwsandbox/teardown/executions" not in names


def check_step(step: int, row: dict[str, Any], exp: Expected) -> None:
    for name, want in exp.steps[step].items():
        assert name in row, (step, name)
        assert row[name] == pytest.approx(want, rel=1e-9), (step, name, row[name], want)
    for name in exp.absent.get(step, []):
        assert name not in row, (step, name)
    if step == 0:
        assert set(COREWEAVE_NAMES) <= row.keys()
        assert_quantiles(row, "startup_seconds", exp.startup)
        assert_quantiles(row, "exec_seconds", exp.exec_wall)
        assert row["cwsandbox/max_exec_seconds"] == pytest.approx(max(exp.exec_wall), rel=1e-12)
        assert row["cwsandbox/sandbox_seconds"] > 0 and row["cwsandbox/window_seconds"] > 0


class Recorder:
    """A reporter that keeps what it is given."""

    name = "recorder"

    def __init__(self) -> None:
        self.rows: list[tuple[int, MetricsSnapshot]] = []
        self.fail = 0
        self.up = True

    def available(self) -> bool:
        return self.up

    def report(self, snapshot: MetricsSnapshot, step: int) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("reporter down")
        self.rows.append((step, snapshot))


async def test_workload_through_a_reporter() -> None:
    rec = Recorder()
    backend = make_backend()
    flushed: list[bool] = []
    async with cwa.Session(backend=backend, report_to=[rec]) as s:
        exp = await workload(s, backend, flushed)
    assert flushed == [True] * 5
    assert [(step, snap.teardown) for step, snap in rec.rows] == [(n, False) for n in range(5)] + [(4, True)]
    for step, snap in rec.rows[:-1]:
        check_step(step, snap.as_dict(), exp)
    check_teardown(rec.rows[-1][1].as_dict(), exp)
    assert sum(snap.executions for step, snap in rec.rows if step != 3) == 107  # 3 was not reset
    assert sum(snap.sandboxes_destroyed for _, snap in rec.rows) == 3 == backend.destroyed
    assert s.snapshot().has_activity is False  # everything went out in the close flush


# -- the histogram ------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(min_value=1e-6, max_value=1e5, allow_nan=False), min_size=1, max_size=400),
    st.sampled_from([0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0]),
)
def test_histogram_quantiles_within_stated_error(values: list[float], q: float) -> None:
    h = QuantileSketch()
    for v in values:
        h.add(v)
    want = exact_quantile(values, q)
    assert abs(h.quantile(q) - want) <= REL_ERR * want
    assert (h.count, h.min, h.max) == (len(values), min(values), max(values))
    assert h.total == pytest.approx(sum(values))


def test_histogram_memory_is_bounded_and_edges() -> None:
    h = QuantileSketch()
    rng = random.Random(3)
    wide = [10 ** rng.uniform(-12, 9) for _ in range(50_000)]  # wider than MAX_BINS covers at 1%
    for v in wide:
        h.add(v)
    assert len(h._sketch._store.bins) <= MAX_BINS  # the library's store, read to check its bound
    for q in (0.5, 0.95, 0.99):  # only the lowest bins collapse: the quantiles reported stay accurate
        assert abs(h.quantile(q) - exact_quantile(wide, q)) <= REL_ERR * exact_quantile(wide, q)
    assert math.isnan(QuantileSketch().quantile(0.5))
    z = QuantileSketch()
    for v in (0.0, 0.0, 0.0, float("nan"), 2.0):
        z.add(v)
    assert z.count == 4 and z.quantile(0.5) == 0.0 and z.quantile(1.0) == 2.0
    with pytest.raises(ValueError, match="quantiles"):
        z.quantile(1.5)
    with pytest.raises(ValueError, match="relative_error"):
        QuantileSketch(0.0)


def test_histogram_merge_equals_one_stream() -> None:
    rng = random.Random(5)
    values = [rng.expovariate(3.0) for _ in range(2000)]
    whole, a, b = QuantileSketch(), QuantileSketch(), QuantileSketch()
    for i, v in enumerate(values):
        whole.add(v)
        (a if i % 3 else b).add(v)
    a.merge(b)
    qs = (0.5, 0.95, 0.99)
    assert a.quantiles(qs) == whole.quantiles(qs) and a.count == whole.count


# -- the aggregator -----------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_sandbox_seconds_and_execs_per_sandbox_follow_windows() -> None:
    clock = Clock()
    m = MetricsAggregator(clock=clock)
    clock.now = 10.0
    m.sandbox_created("a", 2.0)  # requested at 8
    m.sandbox_created("b", 0.0)  # requested at 10
    for _ in range(3):
        m.exec_finished("a", ExecOutcome.COMPLETED_OK, 0.1, 0.05)
    m.exec_finished("b", ExecOutcome.COMPLETED_NONZERO, 0.2, 0.0)
    clock.now = 20.0
    m.sandbox_destroyed("a", 10.0)  # alive 8..20: 12 s
    m.sandbox_created("c", 1.0)  # no execs: not in execs_per_sandbox
    clock.now = 25.0
    snap, old = m.take(reset=True)
    assert snap.sandbox_seconds == pytest.approx(12 + 15 + 6)
    assert snap.execs_per_sandbox is not None
    assert (snap.execs_per_sandbox.count, snap.execs_per_sandbox.min, snap.execs_per_sandbox.max) == (2, 1, 3)
    assert snap.execs_per_sandbox.mean == 2.0 and snap.exec_cpu_seconds == pytest.approx(0.15)
    assert snap.sandboxes_live == 2 and snap.window_seconds == 25.0
    clock.now = 30.0
    m.sandbox_destroyed("b", 20.0)  # 25..30 in the new window
    snap2 = m.snapshot()
    assert snap2.sandbox_seconds == pytest.approx(5 + 5) and snap2.execs_per_sandbox is None
    assert old is not None
    m.restore(old)  # a failed delivery: the old window comes back, nothing counted twice
    snap3 = m.snapshot()
    assert snap3.sandbox_seconds == pytest.approx(33 + 10) and snap3.window_seconds == 30.0
    assert snap3.executions == 4 and snap3.sandboxes_destroyed == 2


def test_pool_lease_retry_sweep_and_gather_events() -> None:
    m = MetricsAggregator()
    waits = [0.001 * (i + 1) for i in range(200)]
    for i, w in enumerate(waits):
        m.lease(w, warm=i % 4 != 0)
    m.pool_gauges(idle=3, leased=2, warming=1, pool_id="p1")
    m.pool_gauges(idle=1, leased=0, warming=4, pool_id="p2")
    for what in ["create", "create", "exec", "Weird Name!"]:
        m.retry(what)
    m.swept(4)
    for kind in ["ok", "ok", "error", "timeout"]:
        m.gather_outcome(kind, 0.5)
    d = m.snapshot().as_dict()
    assert d["cwsandbox/leases"] == 200 and d["cwsandbox/warm_hits"] == 150
    assert d["cwsandbox/warm_hit_rate"] == 0.75
    assert_quantiles(d, "lease_wait_seconds", waits)
    assert (d["cwsandbox/pool_idle"], d["cwsandbox/pool_leased"], d["cwsandbox/pool_warming"]) == (4, 2, 5)
    assert d["cwsandbox/retries"] == 4 and d["cwsandbox/retries_create"] == 2
    assert d["cwsandbox/retries_exec"] == 1 and d["cwsandbox/retries_weird_name"] == 1
    assert d["cwsandbox/orphans_swept"] == 4
    assert (d["cwsandbox/gather_ok"], d["cwsandbox/gather_error"], d["cwsandbox/gather_timeout"]) == (2, 1, 1)
    m.pool_closed("p2")
    assert m.snapshot().pool_idle == 3
    for i in range(100):  # labels are bounded
        m.retry(f"kind{i}")
    assert len(m.snapshot().retries) <= 33


def test_events_from_threads_are_never_lost() -> None:
    m = MetricsAggregator()
    per_thread, threads = 5000, 4
    seen: list[int] = []
    done = threading.Event()

    def flusher() -> None:
        while not done.is_set():
            seen.append(m.take(reset=True)[0].executions)

    def worker(n: int) -> None:
        for _ in range(per_thread):
            m.exec_finished(f"sb{n}", ExecOutcome.COMPLETED_OK, 0.01, 0.0)

    f = threading.Thread(target=flusher)
    f.start()
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=HANG_GUARD_SECONDS)
    done.set()
    f.join(timeout=HANG_GUARD_SECONDS)
    assert sum(seen) + m.snapshot().executions == per_thread * threads


# -- the flush path -----------------------------------------------------------------
async def test_failed_or_missing_reporter_keeps_the_window() -> None:
    rec = Recorder()
    async with cwa.Session(backend=FakeBackend(), report_to=[rec]) as s:
        sb = await s.sandbox()
        await sb.exec(["true"])
        assert s.log_metrics(step=0) is True
        assert s.log_metrics(step=1) is False  # nothing happened since
        await sb.exec(["true"])
        rec.fail = 1
        assert s.log_metrics(step=2) is False  # the reporter raised: kept
        rec.up = False
        await sb.exec(["true"])
        with structlog.testing.capture_logs() as logs:
            assert s.log_metrics(step=3) is False  # no reporter available: kept, and said so (once)
            assert s.log_metrics(step=3) is False
        assert [e["log_level"] for e in logs if "no reporter can take" in e["event"]] == ["warning"]
        assert s.snapshot().executions == 2
        rec.up = True
        await sb.exec(["true"])
        assert s.log_metrics(step=4) is True
        with pytest.raises(cwa.SandboxValidationError):
            s.log_metrics(step=-1)
        with pytest.raises(cwa.SandboxValidationError):
            s.log_metrics(step=True)
    assert [(step, snap.executions, snap.teardown) for step, snap in rec.rows] == [
        (0, 1, False),
        (4, 3, False),
        (4, 0, True),  # the close only stopped the sandbox: step 4's teardown, not a step 5
    ]
    assert rec.rows[2][1].sandboxes_destroyed == 1


async def test_silent_sessions_stay_quiet_but_wanted_metrics_are_never_lost_silently() -> None:
    """No report_to and no run: a close that delivers nothing is quiet, unless log_metrics was called."""
    with structlog.testing.capture_logs() as logs:
        async with cwa.Session(backend=FakeBackend()) as s:  # follows wandb.run; there is none
            await (await s.sandbox()).exec(["true"])
    assert logs == [] or all(e["log_level"] != "warning" for e in logs)
    with structlog.testing.capture_logs() as logs:
        async with cwa.Session(backend=FakeBackend()) as s:
            await (await s.sandbox()).exec(["true"])
            assert s.log_metrics(step=0) is False
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert any("no reporter can take" in w for w in warnings), warnings
    assert any("were not reported" in w for w in warnings), warnings
    with structlog.testing.capture_logs() as logs:
        async with cwa.Session(backend=FakeBackend(), report_to=[]) as s:  # disabled on purpose
            await (await s.sandbox()).exec(["true"])
            assert s.log_metrics(step=0) is False
    assert not [e for e in logs if e["log_level"] == "warning"]


async def test_a_close_after_real_work_is_a_step_of_its_own_and_namespaces_keep_sessions_apart() -> None:
    a = Recorder()
    async with (
        cwa.Session(backend=FakeBackend(), report_to=[a]) as s,
        cwa.Session(backend=FakeBackend(), report_to=["log"], metrics_namespace="code_b") as t,
    ):
        sb = await s.sandbox()
        await sb.exec(["true"])
        assert s.log_metrics(step=0)
        await sb.exec(["true"])  # after the last flush: step 1's work, delivered at close
        with structlog.testing.capture_logs() as logs:
            await (await t.sandbox()).exec(["true"])
            assert t.log_metrics(step=0)
    assert [(step, snap.executions, snap.teardown) for step, snap in a.rows] == [(0, 1, False), (1, 1, False)]
    (line,) = [e for e in logs if e["event"] == "sandbox metrics"]
    assert line["namespace"] == "code_b" and line["executions"] == 1
    assert a.rows[0][1].as_dict("code_b")["cwsandbox/code_b/executions"] == 1
    with pytest.raises(cwa.SandboxValidationError):
        cwa.Session(backend=FakeBackend(), metrics_namespace="a/b")


async def test_step_is_bound_for_library_log_lines() -> None:
    with structlog.testing.capture_logs() as logs:
        async with cwa.Session(backend=FakeBackend(), report_to=["log"]) as s:
            sb = await s.sandbox()
            await sb.exec(["true"])
            assert s.log_metrics(step=7)
            assert structlog.contextvars.get_contextvars()["step"] == 8
            await sb.exec(["true"])
        assert "step" not in structlog.contextvars.get_contextvars()
    lines = [e for e in logs if e["event"] == "sandbox metrics"]
    assert [e["step"] for e in lines] == [7, 8]
    assert lines[0]["executions"] == 1 and lines[0]["exec_completion_rate"] == 1.0
    assert lines[1]["sandboxes_destroyed"] == 1 and lines[1]["log_level"] == "info"


async def test_log_metrics_from_another_thread() -> None:
    rec = Recorder()
    async with cwa.Session(backend=FakeBackend(), report_to=[rec, LogReporter()]) as s:
        sb = await s.sandbox()
        await sb.exec(["true"])
        assert await anyio.to_thread.run_sync(s.log_metrics, 3)
    assert [(step, snap.teardown) for step, snap in rec.rows] == [(3, False), (3, True)]


def test_report_to_is_validated() -> None:
    with pytest.raises(cwa.SandboxValidationError, match="unknown reporter"):
        cwa.Session(backend=FakeBackend(), report_to=["tensorboard"])
    with pytest.raises(cwa.SandboxValidationError, match="report_to"):
        cwa.Session(backend=FakeBackend(), report_to=[42])  # type: ignore[list-item]
    with pytest.raises(cwa.SandboxValidationError, match="disables"):
        cwa.Session(backend=FakeBackend(), report_to=[], run=object())
    assert [r.name for r in cwa.Session(backend=FakeBackend(), report_to="log")._reporting.reporters] == ["log"]
    both = cwa.Session(backend=FakeBackend(), report_to=["log", "log"], run=object())._reporting.reporters
    assert [r.name for r in both] == ["log", "wandb"]


@pytest.mark.e2e  # a child interpreter
def test_metrics_never_import_wandb() -> None:
    code = (
        "import sys, anyio, cwsandbox_async as cwa\n"
        "from cwsandbox_async.testing import FakeBackend\n"
        "async def main():\n"
        "    async with cwa.Session(backend=FakeBackend()) as s:\n"
        "        sb = await s.sandbox()\n"
        "        await sb.exec(['true'])\n"
        "        assert s.log_metrics(step=1) is False  # no run: kept, nothing imported\n"
        "        assert s.snapshot().executions == 1\n"
        "anyio.run(main)\n"
        "print('wandb' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_forcing_wandb_without_it_installed_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(cwa.SandboxValidationError, match="pip install"):
        cwa.Session(backend=FakeBackend(), report_to=["wandb"])
