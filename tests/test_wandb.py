"""Metrics into a real (offline) W&B run, read back from the run's .wandb transaction log.

Two runs in all (an offline init costs ~0.5-1 s): one opened the default way and
found through ``wandb.run``, one opened the way ART opens it
(``reinit="create_new"``, which leaves ``wandb.run`` unset) and passed as ``run=``.
"""

from __future__ import annotations

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

from test_metrics import check_step, make_backend, workload  # noqa: E402
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
    assert [row[STEP_METRIC] for row in rows] == [0, 1, 2, 3, 4, 5]  # close flush = last + 1
    steps = [row["_step"] for row in history]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # W&B's own step never went back
    assert [row["train/reward"] for row in history if "train/reward" in row] == [0.5, 0.75, 1.0]
    for row in rows:
        check_step(row[STEP_METRIC], row, exp)
    # nothing dropped: the reset windows add up to the whole workload
    reset_rows = [row for row in rows if row[STEP_METRIC] != 3]
    assert sum(row["cwsandbox/executions"] for row in reset_rows) == 107
    assert sum(row["cwsandbox/sandboxes_created"] for row in reset_rows) == 4
    assert sum(row["cwsandbox/sandboxes_destroyed"] for row in reset_rows) == 3 == backend.destroyed
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
    assert [row[STEP_METRIC] for row in rows] == [7, 8]
    first, close = rows
    assert (first["cwsandbox/executions"], first["cwsandbox/exec_completed_ok"]) == (3, 2)
    assert first["cwsandbox/exec_completion_rate"] == pytest.approx(2 / 3)
    assert first["cwsandbox/avg_execs_per_sandbox"] == 3 and first["cwsandbox/startup_count"] == 1
    assert close["cwsandbox/sandboxes_destroyed"] == 1 and close["cwsandbox/executions"] == 0
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
    data = path.read_bytes()
    assert [row["x"] for row in read_history(path)] == list(range(20))
    torn, flipped = path.with_suffix(".torn"), path.with_suffix(".flipped")
    torn.write_bytes(data[: len(data) - 5])  # the last record cut short
    flipped.write_bytes(data[:400] + bytes([data[400] ^ 0xFF]) + data[401:])  # one byte corrupted
    for bad in (torn, flipped):
        with pytest.raises(TornLog):
            _payloads(bad.read_bytes())
        with pytest.raises(AssertionError, match="incomplete"):
            records(bad, timeout=0.2)
