"""Shared fixtures, and the suite's lanes. anyio runs every async test on asyncio (we depend on aiohttp).

Every test is in exactly one lane, a marker set here by where the test lives (``LANES``):

- ``fast``: the core on the fake backend: validation, the pool, the gatherer, metrics, the
  verdict rules. No real sandbox and no process: a fast-lane test that starts one fails
  (``_fast_lane_starts_nothing``). ``make test-fast`` runs it.
- ``e2e``: real sandboxes (local namespaces), the Kubernetes and CoreWeave test servers, the
  CLI, README and docs blocks, anything that starts a process. A test of a fast file
  parametrized over a real backend (``backend_name="local"``...) is e2e too.
- ``slow``: soak, load, scale.

A test's own ``@pytest.mark.e2e`` / ``slow`` marker wins over its place. ``make test`` runs all three.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from settling_loop import ASYNCIO

from cwsandbox_async import SandboxBackendUnavailableError, Session

# The cluster tier's `real_cluster` fixture (a real kube-apiserver for the session), for any test.
pytest_plugins = ["cluster.plugin"]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """asyncio, on a loop that does not close while grpc still owes it a completion (settling_loop)."""
    return ASYNCIO


@pytest.fixture(autouse=True)
def _structlog_unconfigured() -> Iterator[None]:
    """Each test starts with structlog unconfigured, as an application that never set it up.

    ``structlog.testing.capture_logs`` restores the processors it replaced but leaves structlog
    *configured*, after which the library's events go to structlog's default printer instead of
    the ``cwsandbox_async`` stdlib logger (so ``caplog`` would see nothing in later tests)."""
    yield
    structlog.reset_defaults()


async def _local_problem() -> str | None:
    try:
        async with Session(backend="local") as s, s.sandbox():
            return None
    except SandboxBackendUnavailableError as exc:
        return str(exc)


@pytest.fixture(scope="module")
def local_backend() -> None:
    """Examples and docs blocks run on the local backend by default; skip (with the reason) where it
    cannot start."""
    problem = anyio.run(_local_problem)
    if problem is not None:
        pytest.skip(f"local backend not available: {problem}")


# -- lanes ---------------------------------------------------------------------------------------
LANE_NAMES = ("fast", "e2e", "slow")
#: Where a test lives -> its lane (paths relative to tests/, a folder ends in "/"); the rest is e2e.
LANES = {
    "pool/": "fast",
    "faults/": "fast",
    "integrations/test_extract.py": "fast",
    "images/test_reference.py": "fast",
    "images/test_http.py": "fast",
    "test_budget.py": "fast",
    "test_close.py": "fast",
    "test_contract_fake.py": "fast",
    "test_gather.py": "fast",
    "test_lanes.py": "e2e",  # its inner e2e tests start processes
    "test_metrics.py": "fast",
    "test_sdk_names.py": "fast",
    "test_session.py": "fast",
    "test_validation.py": "fast",
    "test_verdicts.py": "fast",
    "test_load.py": "slow",
}
#: Parameters that choose a backend, and the values that are real sandboxes.
BACKEND_PARAMS = ("backend_name", "program_backend", "backend")
REAL_BACKENDS = ("local", "kubernetes", "coreweave")
TESTS = Path(__file__).resolve().parent


def lane_of(item: pytest.Item) -> str:
    own = [m.name for m in item.iter_markers() if m.name in LANE_NAMES]
    if own:
        if own[0] == "fast":
            raise pytest.UsageError(f"{item.nodeid}: the fast lane is set by place (LANES), not by a marker")
        return own[0]
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(callspec.params.get(p) in REAL_BACKENDS for p in BACKEND_PARAMS):
        return "e2e"
    rel = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
    for where, lane in LANES.items():
        if rel == where or (where.endswith("/") and rel.startswith(where)):
            return lane
    return "e2e"


def _fast_only(config: pytest.Config) -> bool:
    return str(config.getoption("markexpr", "")).strip() == "fast"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m fast`` alone, modules outside the fast places are not even imported (their
    fixtures probe bubblewrap, start servers...): a test there is never fast (``lane_of``)."""
    if not _fast_only(config):
        return None
    rel = collection_path.resolve().relative_to(TESTS).as_posix() if collection_path.is_relative_to(TESTS) else ""
    if not rel or rel == ".":
        return None
    fast = [where for where, lane in LANES.items() if lane == "fast"]
    if collection_path.is_dir():
        return not any(where.startswith(rel + "/") for where in fast)
    if collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        return not any(rel == where or (where.endswith("/") and rel.startswith(where)) for where in fast)
    return None


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT as a terminal gives it, for the tests that send it to a child (the CLI's Ctrl-C).

    A suite started in the background of a non-interactive shell (``make test &``, CI runners)
    inherits SIGINT ignored, and an ignored signal stays ignored across exec: every child would
    ignore the test's SIGINT. Python's own handler here is reset to the default in children."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        lane = lane_of(item)
        if not item.get_closest_marker(lane):
            item.add_marker(lane)


def _refuse(what: str, seen: list[str]) -> Any:
    def refused(*args: object, **kwargs: object) -> Any:
        seen.append(what)
        raise AssertionError(f"a fast-lane test {what}; mark it e2e (tests/conftest.py, LANES)")

    return refused


@pytest.fixture(autouse=True)
def _fast_lane_starts_nothing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fast-lane test may start no real sandbox and no process (a local sandbox is one).

    Both are refused where they happen, and the test fails at teardown even if the code under
    test caught the refusal."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    seen: list[str] = []
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("started a process", seen))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"called os.{name}", seen))
    for module, cls in (
        ("cwsandbox_async.backends.local", "LocalBackend"),
        ("cwsandbox_async.backends.kubernetes", "KubernetesBackend"),
        ("cwsandbox_async.backends.coreweave", "CoreWeaveBackend"),
    ):
        if module in sys.modules:  # not imported yet: its sandboxes are processes or need a test server's
            monkeypatch.setattr(getattr(sys.modules[module], cls), "create", _refuse(f"created a {cls} sandbox", seen))
    yield
    if seen:
        pytest.fail(f"a fast-lane test {seen[0]} (mark it e2e: tests/conftest.py, LANES)")
