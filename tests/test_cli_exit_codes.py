"""Every exit code ``cwsandbox-async --help`` documents, from the situation that should produce it.

Each case runs the real entry point, ``python -m cwsandbox_async``, as a user would, and checks the
code and what stderr says: one ``cwsandbox-async:`` line for an error, no warning about a sandbox
that was never made. An unreachable API is a closed loopback port. Codes whose situation is costly
to stage are tested where that situation already is (``ELSEWHERE``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from adversarial.conftest import bwrap_problem
from guards import HANG_GUARD_SECONDS
from k8s.conftest import TEST_IMAGE, k8s_server, needs_bwrap  # noqa: F401
from k8s.server import KubeTestServer

from cwsandbox_async import ExecResult, __version__
from cwsandbox_async.cli import EXIT_CODES

ROOT = Path(__file__).resolve().parent.parent
local_only = pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))
#: Documented codes staged in other tests (a signal or a failing probe), by the test that stages them.
ELSEWHERE = {
    1: "test_cli.py::test_doctor_fails_where_there_is_no_isolation",
    130: "test_cli.py::test_interrupting_exec_stops_its_sandbox",
}
#: Codes staged here.
HERE = {0, 2, 3, 4, 124, 125, 126, 127}


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stderr.splitlines()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def run(*args: str, within: float = HANG_GUARD_SECONDS) -> Ran:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CWSANDBOX_", "KUBERNETES_"))}
    env["KUBECONFIG"] = "/nonexistent/kubeconfig"  # never a real cluster by accident
    with anyio.fail_after(within):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cwsandbox_async", *args,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=ROOT, env=env,
        )  # fmt: skip
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def test_every_documented_code_is_staged_somewhere() -> None:
    assert set(EXIT_CODES) == HERE | set(ELSEWHERE)


async def test_the_module_runs_the_cli_and_says_its_version() -> None:
    r = await run("--version")
    assert (r.code, r.stdout.strip()) == (0, f"cwsandbox-async {__version__}")
    r = await run("--help")
    assert r.code == 0 and "exit codes:" in r.stdout and r.stdout.startswith("usage: cwsandbox-async")


@pytest.mark.parametrize(
    ("args", "says", "hint"),
    [
        (["exec", "--timeout", "soon", "--", "true"], "argument --timeout: not a number of seconds: 'soon'", "exec"),
        (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'", ""),
        ([], "the following arguments are required: COMMAND", ""),
        (["--backend", "kubernetes", "--isolation", "none", "list"], "--isolation: only for --backend local", None),
    ],
)
async def test_2_bad_arguments_are_one_line(args: list[str], says: str, hint: str | None) -> None:
    r = await run(*args)
    assert r.code == 2, r
    assert r.lines[0].startswith(f"cwsandbox-async: {says}"), r
    if hint is None:  # found after argparse: the message says it all
        assert len(r.lines) == 1, r
    else:  # argparse's: where to read more, not its whole usage
        assert r.lines[1:] == [f"cwsandbox-async: see 'cwsandbox-async{' ' + hint if hint else ''} --help'"], r
    assert "usage:" not in r.stderr and r.stdout == ""


async def test_2_a_bad_argument_with_json_is_a_json_document_too() -> None:
    r = await run("exec", "--json", "--timeout", "soon", "--", "true")
    assert r.code == 2 and json.loads(r.stdout) == {
        "exit_code": 2,
        "error": {"type": "ArgumentError", "message": "argument --timeout: not a number of seconds: 'soon'"},
    }, r


async def test_2_kubernetes_without_an_image_destroys_nothing_and_says_one_line() -> None:
    r = await run("--backend", "kubernetes", "--server", f"http://127.0.0.1:{closed_port()}", "exec", "--", "true")
    assert r.code == 2, r
    assert r.lines == ["cwsandbox-async: the kubernetes backend needs an image: set SandboxDefaults.image or image=..."]


@pytest.mark.parametrize(
    "backend",
    [
        ["--backend", "kubernetes", "--image", TEST_IMAGE, "--server"],
        ["--backend", "coreweave", "--base-url"],
    ],
    ids=["kubernetes", "coreweave"],
)
@pytest.mark.parametrize("command", [["exec", "--", "true"], ["list"]], ids=["exec", "list"])
async def test_3_an_unreachable_api(backend: list[str], command: list[str]) -> None:
    if backend[1] == "coreweave":
        pytest.importorskip("grpc", reason="the coreweave extra is not installed")
    r = await run(*backend, f"http://127.0.0.1:{closed_port()}", "--json", *command)
    assert r.code == 3, r
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 3 and doc["error"]["type"] == "SandboxBackendUnavailableError", doc
    assert r.lines[-1].startswith("cwsandbox-async: ") and "127.0.0.1" in r.lines[-1], r
    assert not any("destroy" in line for line in r.lines), r  # no sandbox was made: none to destroy


@needs_bwrap
async def test_4_a_failed_sandbox_operation(k8s_server: KubeTestServer) -> None:  # noqa: F811
    """``list`` when the API answers with an error that is not about reaching it."""
    k8s_server.add_fault("status", method="GET", path="/api/v1/namespaces/default/pods", status=400, times=100)
    r = await run("--backend", "kubernetes", "--server", k8s_server.url, "--namespace", "default", "list")
    assert r.code == 4, r
    assert r.lines[-1].startswith("cwsandbox-async: ") and "400" in r.lines[-1], r


@needs_bwrap
async def test_125_exec_whose_sandbox_fails(k8s_server: KubeTestServer) -> None:  # noqa: F811
    """The sandbox cannot be made (the API refuses the pod for a reason other than reachability)."""
    k8s_server.add_fault("status", method="POST", path="/api/v1/namespaces/default/pods", status=500, times=100)
    args = ["--backend", "kubernetes", "--server", k8s_server.url, "--namespace", "default", "--image", TEST_IMAGE]
    r = await run(*args, "exec", "--create-timeout", "20", "--json", "--", "true")
    assert r.code == 125, r
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 125 and doc["error"]["type"] not in ("SandboxBackendUnavailableError", "UsageError")


@local_only
@pytest.mark.parametrize(
    ("command", "code"),
    [
        (["--", "true"], 0),
        (["--", "sh", "-c", "exit 3"], 3),  # the command's own status passes through
        (["--", "sh", "-c", "kill -9 $$"], 128 + 9),  # killed by signal N: 128+N
        (["--", "/etc/passwd", "x"], 126),
        (["--", "/nonexistent/program", "x"], 127),
    ],
)
async def test_exec_exits_with_the_commands_status(command: list[str], code: int) -> None:
    r = await run("exec", *command)
    assert r.code == code, r


@local_only
async def test_124_a_command_past_its_timeout() -> None:
    r = await run("exec", "--timeout", "1", "--", "sleep", "30")
    # 125 instead when the command spent its second waiting for a CPU (a busy machine), and it says so
    assert r.code == 124 or (r.code == 125 and "starved of CPU" in r.stderr), r
    assert r.lines[-1].startswith("cwsandbox-async: "), r


@local_only
async def test_2_a_cwd_that_is_not_a_directory() -> None:
    """Not made for the command (it was, as the sandbox's working directory), and the command never runs."""
    r = await run("exec", "--cwd", "/missing-dir", "--", "pwd")
    assert (r.code, r.stdout) == (2, ""), r
    assert len(r.lines) == 1 and r.lines[0].startswith("cwsandbox-async: --cwd /missing-dir: not a directory"), r
    r = await run("exec", "--cwd", "/etc/hostname", "--", "pwd")
    assert r.code == 2 and "not a directory" in r.stderr, r
    r = await run("exec", "--cwd", "/tmp", "--", "pwd")
    assert (r.code, r.stdout) == (0, "/tmp\n"), r  # the command's directory, not the sandbox's workspace


@local_only
async def test_exec_json_has_every_fact_of_the_result() -> None:
    r = await run("exec", "--json", "--", "echo", "hi")
    doc = json.loads(r.stdout)
    names = {f.name.removesuffix("_bytes") for f in dataclasses.fields(ExecResult)}
    missing = names - set(doc)
    assert not missing, missing
    assert doc["oom_killed"] is False and doc["signal"] is None and doc["command"] == ["echo", "hi"]
