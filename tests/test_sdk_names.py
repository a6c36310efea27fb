"""Names CoreWeave SDK users already know: container_image=, e.filepath, get_metrics(), list(status=)."""

from __future__ import annotations

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.testing import FakeBackend


def test_container_image_is_image() -> None:
    assert cwa.SandboxDefaults(container_image="python:3.11").image == "python:3.11"
    assert cwa.SandboxDefaults().with_overrides(container_image="python:3.12").image == "python:3.12"
    assert cwa.SandboxDefaults(image="a", container_image="a").image == "a"
    with pytest.raises(cwa.SandboxValidationError, match="container_image"):
        cwa.SandboxDefaults(image="a", container_image="b")


async def test_session_accepts_the_sdk_spelling() -> None:
    async with cwa.Session({"container_image": "python:3.11", "tags": ("t",)}, backend=FakeBackend()) as s:
        assert s.defaults.image == "python:3.11"
        sb = await s.sandbox(container_image="python:3.12")
        assert sb.defaults.image == "python:3.12"


def test_file_error_filepath() -> None:
    err = cwa.SandboxFileError("missing", path="/workspace/x")
    assert err.filepath == err.path == "/workspace/x"


async def test_get_metrics_is_the_snapshot_mapping() -> None:
    async with cwa.Session(backend=FakeBackend()) as s:
        sb = await s.sandbox()
        await sb.exec(["echo", "x"])
        metrics = s.get_metrics()
        assert metrics.keys() == s.snapshot().as_dict().keys()
        assert metrics["cwsandbox/executions"] == 1
        assert s.get_metrics()["cwsandbox/executions"] == 1  # reading resets nothing


async def test_list_filters_by_status() -> None:
    async with cwa.Session(cwa.SandboxDefaults(tags=("st",)), backend=FakeBackend()) as s:
        sb = await s.sandbox()
        running = await s.list(status="running")
        assert [i.sandbox_id for i in running] == [sb.sandbox_id]
        assert [i.sandbox_id for i in await s.list(status=[cwa.SandboxStatus.RUNNING, "failed"])] == [sb.sandbox_id]
        assert await s.list(status="completed") == []
        assert [i.sandbox_id for i in await s.list(status="paused")] == [sb.sandbox_id]  # SDK name: running
        with pytest.raises(cwa.SandboxValidationError, match="unknown status"):
            await s.list(status="sleeping")
