"""The attack matrix's fixtures: one local Session per module, and each path's results computed once.

A path's results are computed the first time one of its cells asks (every attack of the path at
once: see ``paths.py``), and kept for the rest of the run. Under pytest-xdist (``make test``) the
workers share them through files beside their base temp directory, each path behind its own lock:
the first worker to need a path computes it, the other reads it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path as FsPath
from typing import Any

import anyio
import pytest
from settling_loop import ASYNCIO

import cwsandbox_async as cwa

from .corpus import ATTACKS, PYTHONPATH_DIR
from .paths import Outcome, Path, Seen


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ASYNCIO


@pytest.fixture(scope="module")
async def attack_session() -> AsyncIterator[cwa.Session]:
    from local.conftest import bwrap_problem

    if bwrap_problem() is not None:
        pytest.skip(str(bwrap_problem()))
    defaults = cwa.SandboxDefaults(
        tags=("attack-matrix",),
        resources=cwa.Resources(memory_mib=1536, pids=256),
        env={"PYTHONPATH": PYTHONPATH_DIR},  # a writable directory on it, as some images have
    )
    async with cwa.Session(defaults, backend="local") as session:
        yield session


def _encode(outcomes: dict[str, Outcome]) -> str:
    def seen(s: Seen) -> dict[str, Any]:
        return {"score": s.score, "kind": s.kind, "reason": s.reason, "raised": s.raised}

    return json.dumps(
        {
            name: {"attack": seen(o.attack), "neighbours": [[label, want, seen(s)] for label, want, s in o.neighbours]}
            for name, o in outcomes.items()
        }
    )


def _decode(text: str) -> dict[str, Outcome]:
    return {
        name: Outcome(Seen(**o["attack"]), tuple((label, want, Seen(**s)) for label, want, s in o["neighbours"]))
        for name, o in json.loads(text).items()
    }


class Results:
    """Each path's outcomes, by attack name: computed once per run (see the module docstring)."""

    def __init__(self, root: FsPath, session: cwa.Session) -> None:
        self.root, self.session = root, session
        self.memo: dict[str, dict[str, Outcome]] = {}

    async def of(self, path: Path) -> dict[str, Outcome]:
        if path.id not in self.memo:
            stem = self.root / f"attack-matrix-{path.id.replace('/', '-')}"
            lock = await anyio.to_thread.run_sync(_lock, stem.with_suffix(".lock"))
            try:
                done = stem.with_suffix(".json")
                if done.exists():
                    self.memo[path.id] = _decode(done.read_text())
                else:
                    attacks = [a for a in ATTACKS if path.applies(a)]
                    start = time.monotonic()
                    outcomes = await path.run(self.session, attacks)
                    self.memo[path.id] = dict(zip([a.name for a in attacks], outcomes, strict=True))
                    done.write_text(_encode(self.memo[path.id]))
                    # how long the path took (for whoever measures the matrix's cost)
                    stem.with_suffix(".seconds").write_text(f"{time.monotonic() - start:.1f}\n")
            finally:
                os.close(lock)
        return self.memo[path.id]


def _lock(path: FsPath) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # released when the fd closes
    return fd


@pytest.fixture(scope="module")
def attack_results(attack_session: cwa.Session, tmp_path_factory: pytest.TempPathFactory) -> Results:
    base = tmp_path_factory.getbasetemp()
    return Results(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base, attack_session)
