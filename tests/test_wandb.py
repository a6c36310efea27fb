"""Metrics into a real (offline) W&B run, read back from the run's .wandb transaction log.

Two runs in all (an offline init costs ~0.5-1 s): one opened the default way and
found through ``wandb.run``, one opened the way ART opens it
(``reinit="create_new"``, which leaves ``wandb.run`` unset) and passed as ``run=``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

import cwsandbox_async as cwa
from cwsandbox_async.reporters import STEP_METRIC
from cwsandbox_async.testing import FakeBackend

wandb = pytest.importorskip("wandb")

from test_metrics import check_step, check_teardown, make_backend, workload  # noqa: E402
from wandb_reader import TornLog, _payloads, read_history, read_metric_definitions, records  # noqa: E402


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_X_DISABLE_STATS": "true",
        "WANDB_X_DISABLE_MACHINE_INFO": "true",
    }.items():
        monkeypatch.setenv(key, value)
    yield tmp_path
    if wandb.run is not None:
        wandb.run.finish()


def our_rows(path: str) -> list[dict[str, Any]]:
    return [row for row in read_history(path) if STEP_METRIC in row]


def assert_step_metric_declared(path: str) -> None:
    defs = read_metric_definitions(path)
    assert ("cwsandbox/step", "", "") in defs
    assert ("", "cwsandbox/*", "cwsandbox/step") in defs


async def test_workload_history_read_back_from_the_run(offline: Path) -> None:
    run = wandb.init(project="cwsandbox-async-test")
    assert wandb.run is run
    backend = make_backend()
    flushed: list[bool] = []
    async with cwa.Session(backend=backend) as s:  # report_to=None finds wandb.run
        run.log({"train/reward": 0.5})  # the trainer's own rows interleave freely
        exp = await workload(s, backend, flushed)
        run.log({"train/reward": 0.75})
    run.log({"train/reward": 1.0})
    path = run.settings.sync_file
    run.finish()

    assert flushed == [True] * 5
    history = read_history(path)
    rows = our_rows(path)
    assert [row[STEP_METRIC] for row in rows] == [0, 1, 2, 3, 4, 4]  # the close's teardown joins step 4
    steps = [row["_step"] for row in history]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # W&B's own step never went back
    assert [row["train/reward"] for row in history if "train/reward" in row] == [0.5, 0.75, 1.0]
    for row in rows[:-1]:
        check_step(row[STEP_METRIC], row, exp)
    check_teardown(rows[-1], exp)
    # nothing dropped: the reset windows add up to the whole workload
    reset_rows = [row for row in rows[:-1] if row[STEP_METRIC] != 3]
    assert sum(row["cwsandbox/executions"] for row in reset_rows) == 107
    assert sum(row["cwsandbox/sandboxes_created"] for row in reset_rows) == 4
    destroyed = sum(row["cwsandbox/sandboxes_destroyed"] for row in reset_rows)
    assert destroyed + rows[-1]["cwsandbox/teardown/sandboxes_destroyed"] == 3 == backend.destroyed
    assert_step_metric_declared(path)


async def test_art_style_run_through_run_argument(offline: Path) -> None:
    run = wandb.init(project="cwsandbox-async-test", reinit="create_new")
    assert wandb.run is None  # what ART's runs look like
    path = run.settings.sync_file
    async with (
        cwa.Session(backend=FakeBackend(), run=run) as s,
        cwa.Session(backend=FakeBackend()) as blind,  # report_to=None cannot see this run
        cwa.Session(backend=FakeBackend(), report_to=["wandb"]) as forced,  # nor can a forced one
    ):
        for session in (s, blind, forced):
            sb = await session.sandbox()
            for argv in (["true"], ["false"], ["true"]):
                await sb.exec(argv)
        assert blind.log_metrics(step=7) is False and blind.snapshot().executions == 3
        with structlog.testing.capture_logs() as logs:
            assert forced.log_metrics(step=7) is False
        assert any("no active W&B run" in e["event"] for e in logs)
        # the TRL bridge calls from its own thread
        assert await anyio.to_thread.run_sync(s.log_metrics, 7) is True
    run.finish()

    rows = our_rows(path)
    assert [row[STEP_METRIC] for row in rows] == [7, 7]  # the close only stopped the sandbox: step 7's teardown
    first, close = rows
    assert (first["cwsandbox/executions"], first["cwsandbox/exec_completed_ok"]) == (3, 2)
    assert first["cwsandbox/exec_completion_rate"] == pytest.approx(2 / 3)
    assert first["cwsandbox/avg_execs_per_sandbox"] == 3 and first["cwsandbox/startup_count"] == 1
    assert close["cwsandbox/teardown/sandboxes_destroyed"] == 1 and "cwsandbox/executions" not in close
    assert_step_metric_declared(path)

    # a run finished before the session: nothing raised, nothing lost, still readable
    async with cwa.Session(backend=FakeBackend(), run=run) as late:
        sb = await late.sandbox()
        await sb.exec(["true"])
        assert late.log_metrics(step=1) is False
        assert late.snapshot().executions == 1
    assert (late.snapshot().executions, late.snapshot().sandboxes_destroyed) == (1, 1)
    assert len(our_rows(path)) == 2


def test_the_reader_never_parses_a_torn_or_corrupt_log(offline: Path) -> None:
    """wandb-core may still be writing when we read: a half-written record is waited for, never decoded."""
    run = wandb.init(project="cwsandbox-async-test", reinit="create_new")
    for i in range(20):
        run.log({"x": i})
    path = Path(run.settings.sync_file)
    run.finish()
    assert [row["x"] for row in read_history(path)] == list(range(20))  # waits until wandb-core wrote it all
    data = path.read_bytes()
    torn, flipped = path.with_suffix(".torn"), path.with_suffix(".flipped")
    torn.write_bytes(data[: len(data) - 5])  # the last record cut short
    mid = len(data) // 2
    flipped.write_bytes(data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :])  # one byte corrupted
    for bad in (torn, flipped):
        with pytest.raises(TornLog):
            _payloads(bad.read_bytes())
        with pytest.raises(AssertionError, match="incomplete"):
            records(bad, timeout=0.2)


# -- ART: wandb_run(model) ---------------------------------------------------------------------


class DuckModel:
    """What wandb_run reads from an ART model (the real one is tested below, marked integration)."""

    def __init__(self, report_metrics: list[str] | None = None) -> None:
        self.project, self.name, self.report_metrics = "cwsandbox-async-test", "duck-model", report_metrics
        self.getter_calls = 0

    def _get_wandb_run(self) -> Any:
        self.getter_calls += 1
        return "art's run"


def test_wandb_run_offline_without_a_key_opens_the_run_art_would(offline: Path) -> None:
    from cwsandbox_async.integrations.art import wandb_run

    run = wandb_run(DuckModel())
    try:
        assert run.project == "cwsandbox-async-test" and run.name == "duck-model" and run.id == "duck-model"
        assert wandb.run is None  # reinit="create_new", as ART opens it
    finally:
        run.finish()


def test_wandb_run_uses_arts_run_with_a_key_and_is_none_only_when_wandb_is_off(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cwsandbox_async.integrations.art import wandb_run

    assert wandb_run(DuckModel(report_metrics=[])) is None
    assert wandb_run(DuckModel(report_metrics=["stdout"])) is None
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_run(DuckModel()) is None
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # ART logs (and opens its run) only with a key
    model = DuckModel(report_metrics=["wandb"])
    assert wandb_run(model) == "art's run" and model.getter_calls == 1


def test_wandb_run_fails_loudly_when_wandb_is_wanted_but_cannot_be_had(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cwsandbox_async.integrations.art import wandb_run

    monkeypatch.delenv("WANDB_MODE")  # online, no key: ART would log nowhere
    with pytest.raises(cwa.SandboxError, match="WANDB_API_KEY") as info:
        wandb_run(DuckModel())
    assert info.value.infrastructure is False
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(cwa.SandboxError, match="an ART model"):
        wandb_run(object())
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    with pytest.raises(cwa.SandboxError, match="_get_wandb_run"):
        wandb_run(type("NotArt", (), {"report_metrics": None})())


@pytest.mark.integration
async def test_art_rollouts_land_at_the_step_art_logs_them(
    offline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ART logs a step's groups at ``result.step``; the sandbox metrics of those rollouts go to that step too."""
    if importlib.util.find_spec("art") is None:
        pytest.skip("needs the art extra")
    from cwsandbox_async.integrations.art import require_art, wandb_run

    art = require_art()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # ART logs (and opens its run) only with a key; offline ignores it
    model = art.Model(name="align-test", project="cwsandbox-async-test", base_path=str(tmp_path / "art"))
    run = wandb_run(model)
    assert run is model._get_wandb_run()  # ART's own run, not a second one
    backend = FakeBackend()
    async with cwa.Session(backend=backend, run=run) as session:
        for step in range(await model.get_step(), 2):
            async with session.sandbox() as sb:  # this step's rollouts: step + 1 execs
                for _ in range(step + 1):
                    await sb.exec(["true"])
            trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=float(step))
            # training would return result.step = step + 1; ART logs the groups there
            await model.log([art.TrajectoryGroup([trajectory])], split="train", step=step + 1)
            session.log_metrics(step=step + 1)
    path = run.settings.sync_file
    run.finish()

    history = read_history(path)
    art_rows = {row["training_step"]: row["train/reward"] for row in history if "train/reward" in row}
    ours = {row[STEP_METRIC]: row["cwsandbox/executions"] for row in history if STEP_METRIC in row}
    assert art_rows == {1: 0.0, 2: 1.0}
    assert ours == {1: 1, 2: 2}  # the same steps; no teardown-only row after them
