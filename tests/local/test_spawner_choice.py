"""``CWSANDBOX_LOCAL_SPAWNER=python`` is said once at INFO (what the caller asked for is not a warning)."""

from __future__ import annotations

import logging

import pytest

from cwsandbox_async.backends.local import _native


def test_the_python_path_asked_for_is_said_once_at_info(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(_native.ENV, "python")
    monkeypatch.setattr(_native, "_asked", False)
    monkeypatch.setattr(_native, "_warned", False)
    caplog.set_level(logging.INFO, logger="cwsandbox_async")
    assert _native.spawner() is None
    assert _native.spawner() is None
    said = [r for r in caplog.records if _native.ENV in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO], [(r.levelname, r.getMessage()) for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # no wolf cried
