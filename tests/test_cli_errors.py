"""The CLI's errors in the CLI's words: flags named as typed, truncation said on stderr; the local
backend's warning for an image it cannot use. Run as a subprocess (``python -m cwsandbox_async.cli``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from guards import HANG_GUARD_SECONDS
from structlog.testing import capture_logs

from cwsandbox_async import Session

ROOT = Path(__file__).resolve().parent.parent
EXIT_USAGE = 2


def cli(*args: str, within: float = HANG_GUARD_SECONDS) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CWSANDBOX_")}
    return subprocess.run(
        [sys.executable, "-m", "cwsandbox_async.cli", *args],
        capture_output=True,
        text=True,
        timeout=within,
        cwd=ROOT,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(
    ("flags", "named", "says"),
    [
        (["--timeout", "-1"], "--timeout", "must be a positive number of seconds, got -1"),
        (["--timeout", "0"], "--timeout", "must be a positive number of seconds, got 0"),
        (["--timeout", "soon"], "--timeout", "not a number of seconds: 'soon'"),
        (["--create-timeout", "-5"], "--create-timeout", "must be a positive number of seconds"),
        (["--memory-mib", "0"], "--memory-mib", "must be a positive integer, got 0"),
        (["--pids", "-3"], "--pids", "must be a positive integer"),
        (["--cpu", "-1"], "--cpu", "must be a positive number of cores"),
        (["--max-output-bytes", "0"], "--max-output-bytes", "must be a positive integer"),
    ],
)
def test_a_bad_flag_is_named_as_typed(flags: list[str], named: str, says: str) -> None:
    ran = cli("exec", *flags, "--", "true")
    assert ran.returncode == EXIT_USAGE, ran
    assert f"argument {named}: {says}" in ran.stderr, ran.stderr
    assert "timeout_seconds" not in ran.stderr and "Traceback" not in ran.stderr


def local_problem() -> str | None:
    async def probe() -> str | None:
        try:
            async with Session(backend="local") as s, s.sandbox():
                return None
        except Exception as exc:
            return str(exc)

    return anyio.run(probe)


@pytest.fixture(scope="module")
def local() -> None:
    problem = local_problem()
    if problem is not None:
        pytest.skip(f"local backend not available: {problem}")


def test_truncated_output_is_said_on_stderr(local: None) -> None:
    ran = cli("exec", "--max-output-bytes", str(1 << 20), "--", "yes")
    assert ran.returncode != 0  # killed at the cap
    assert len(ran.stdout) == 1 << 20
    assert "cwsandbox-async: output truncated at 1 MiB (--max-output-bytes); the command was killed" in ran.stderr
    small = cli("exec", "--max-output-bytes", "1000", "--", "yes")
    assert "output truncated at 1000 bytes" in small.stderr
    fine = cli("exec", "--", "echo", "hi")
    assert fine.returncode == 0 and "truncated" not in fine.stderr


async def test_an_image_where_the_local_backend_cannot_run_one_is_a_warning_once_per_session(local: None) -> None:
    """Template-born sandboxes run images (tests/local/test_image_sandbox.py); a backend without them
    (here ``isolation="none"``, asked for by name) says once that it ignores the image."""

    async def twice() -> None:
        options = {"isolation": "none"}
        async with Session(backend="local", backend_options=options, defaults={"image": "python:3.12"}) as s:
            for _ in range(2):
                async with s.sandbox():
                    pass

    with capture_logs() as logs, pytest.warns(RuntimeWarning, match="NOT isolated"):
        await twice()
    warned = [e for e in logs if "image ignored" in e["event"]]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning" and warned[0]["image"] == "python:3.12"
    assert "host's root file system" in warned[0]["event"]
