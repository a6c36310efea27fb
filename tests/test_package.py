"""Package-level promises: the export list, lazy imports, quiet logging, structured log context."""

from __future__ import annotations

import importlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import structlog
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async import _log
from cwsandbox_async.testing import FakeBackend


def test_all_is_sorted_and_complete() -> None:
    assert list(cwa.__all__) == sorted(cwa.__all__)
    for name in cwa.__all__:
        assert hasattr(cwa, name), name
    public = {n for n in dir(cwa) if not n.startswith("_")}
    subpackages = {
        "backends", "cli", "gatherer", "images", "integrations", "judge", "metrics", "pool", "reporters", "testing",
    }  # fmt: skip
    leaked = public - set(cwa.__all__) - subpackages  # no stray `annotations` (a __future__ import) either
    assert leaked == set(), f"names exported without being in __all__: {sorted(leaked)}"


#: The public names, pinned: a change here is a change of the public API (and a CHANGELOG entry).
PUBLIC_NAMES = [
    "ExecOutcome", "ExecResult", "GatherStatistics", "GroupedOutcomes", "ImagePullError", "Lease",
    "MetricsSnapshot",
    "Outcome", "OutcomeKind", "OutcomeStream", "PoolClosedError", "PoolError", "PoolState",
    "PoolStatistics", "PoolTimeoutError", "Process", "ProcessResult", "Resources", "Sandbox",
    "SandboxBackendUnavailableError", "SandboxCreationError", "SandboxDefaults", "SandboxError",
    "SandboxExecutionError", "SandboxFileError", "SandboxInfo", "SandboxNotFoundError", "SandboxNotRunningError",
    "SandboxNotSupportedError", "SandboxPool", "SandboxStatus", "SandboxTerminatedError", "SandboxTimeoutError",
    "SandboxTransportError", "SandboxValidationError", "Session", "Shell", "Timeouts", "Transfer", "__version__",
    "as_completed", "gather", "gather_groups", "wait",
]  # fmt: skip


def test_public_names_are_pinned() -> None:
    assert cwa.__all__ == PUBLIC_NAMES
    assert cwa.gather.__module__ == "cwsandbox_async.gatherer._gather", "gather is the function, not a module"
    assert cwa.ProcessResult is cwa.ExecResult


#: The public module paths users import, with their export lists pinned (extend them deliberately).
PUBLIC_MODULES = {
    "cwsandbox_async.backends": ["BACKENDS", "Backend", "OutputCallback", "load_backend"],
    "cwsandbox_async.backends.base": ["Backend", "OutputCallback"],
    "cwsandbox_async.backends.probes": [
        "FAIL", "OK", "SKIP", "WARN", "Check", "DoctorProbe", "DoctorRequest", "Section", "Status",
    ],
    "cwsandbox_async.backends.local": ["DEFAULT_PRELOAD", "LocalBackend"],
    "cwsandbox_async.backends.kubernetes": ["KubernetesBackend", "KubernetesOptions"],
    "cwsandbox_async.backends.coreweave": ["CoreWeaveBackend", "CoreWeaveOptions"],
    "cwsandbox_async.testing": ["ExecExit", "ExecHandler", "FakeBackend", "Faults", "Latency"],
    "cwsandbox_async.testing.contract": ["BackendContract", "make_request", "make_spec"],
    "cwsandbox_async.reporters": ["STEP_METRIC", "LogReporter", "Reporter", "WandbReporter"],
    "cwsandbox_async.integrations.trl": [
        "AsyncCodeReward", "CodeReward", "Extractor", "RewardCallStats", "RewardSettings", "SyncCodeReward",
        "code_reward",
        "code_reward_sync",
        "completion_text", "extract_code",
        "CompletionVerdict", "VerdictCallback", "VerdictKind",
    ],
    "cwsandbox_async.integrations.art": [
        "ALL_TOOLS", "BASH_TOOL", "CODE_TOOLS", "EXECUTE_CODE_TOOL", "READ_FILE_TOOL", "SHELL_TOOLS",
        "SUBMIT_SOLUTION_TOOL", "WRITE_FILE_TOOL", "RolloutTimeoutError", "ToolCall", "ToolResult", "execute_tool",
        "parse_tool_call", "require_art", "run_tool", "sandbox_rollout", "to_responses_format", "tool_message",
        "wandb_run",
        "CompletionVerdict", "VerdictKind",
    ],
    "cwsandbox_async.cli": ["EXIT_CODES", "main"],
    "cwsandbox_async.images": [
        "OPAQUE_XATTR", "CachedImage", "Image", "ImageConfig", "ImageLease", "ImageOptions", "ImageReferenceError",
        "Platform", "ProgressCallback", "PruneResult", "PullProgress", "Reference", "acquire", "cached", "hold",
        "host_platform", "list_images", "parse_reference", "prune", "pull", "remove", "tqdm_progress",
    ],
    "cwsandbox_async.judge": [
        "COMPARE_MODES", "LANGUAGES", "CaseResult", "Checker", "Judge", "JudgeError", "JudgeOptions", "JudgeResult",
        "Language", "Limits", "Problem", "TestCase", "ToolchainError", "Verdict", "from_apps", "from_asserts",
        "from_codecontests", "from_livecodebench", "from_taco", "get_language", "register_language",
    ],
}  # fmt: skip


@pytest.mark.parametrize("path", sorted(PUBLIC_MODULES))
def test_public_module_paths_stay(path: str) -> None:
    module = importlib.import_module(path)
    assert sorted(module.__all__) == sorted(PUBLIC_MODULES[path]), f"{path}'s exports changed"
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == [], f"{path} lost {missing}"


def test_import_is_lazy() -> None:
    code = (
        "import sys, cwsandbox_async\n"
        "heavy = [m for m in ('wandb', 'aiohttp', 'cwsandbox_async.backends.local',"
        " 'cwsandbox_async.backends.kubernetes', 'kubernetes', 'kubernetes_asyncio', 'yaml',"
        " 'cwsandbox_async.backends.coreweave', 'grpc', 'cwsandbox') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=HANG_GUARD_SECONDS
    )
    assert out.stdout.strip() == "[]"


def test_library_is_quiet_by_default() -> None:
    code = (
        "import anyio, cwsandbox_async as cwa\n"
        "from cwsandbox_async.testing import FakeBackend, Faults\n"
        "async def main():\n"
        "    async with cwa.Session(backend=FakeBackend()) as s:\n"
        "        sb = await s.sandbox()\n"
        "        await sb.exec(['echo', 'x'])\n"
        "        await s.sweep(['none'])\n"
        "anyio.run(main)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=HANG_GUARD_SECONDS
    )
    assert (out.stdout, out.stderr) == ("", "")


async def test_events_carry_session_and_sandbox_ids() -> None:
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        async with cwa.Session(backend=FakeBackend()) as s:
            sb = await s.sandbox()
            await sb.stop()
    created = [e for e in logs if e["event"] == "sandbox created"]
    destroyed = [e for e in logs if e["event"] == "sandbox destroyed"]
    assert created and destroyed
    assert created[0]["sandbox_id"] == sb.sandbox_id == destroyed[0]["sandbox_id"]
    assert all(e.get("session_id") == s.session_id for e in created + destroyed)
    assert _log.log is not None


def test_wheel_ships_py_typed_and_the_license(tmp_path: Path) -> None:
    """Type checkers read the package's types only with ``py.typed``; the wheel carries the Apache-2.0 text."""
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=root,
        capture_output=True,
        check=True,
        timeout=HANG_GUARD_SECONDS,
    )
    (wheel,) = tmp_path.glob("cwsandbox_async-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "cwsandbox_async/py.typed" in names
        (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        text = zf.read(license_name).decode()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = zf.read(metadata_name).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10_000
    assert "License-Expression: Apache-2.0" in metadata
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)
