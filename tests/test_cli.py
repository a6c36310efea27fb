"""The operator CLI: output, JSON and exit codes.

Most commands run in this process (``cli``: the CLI's ``main`` in a worker thread, with its own
stdin, stdout and stderr), as a new interpreter per command costs seconds on a busy machine and
is not what these tests are about. What is about the process boundary runs the real entry point
as a subprocess (``cli_process``): the exit code through ``python -m cwsandbox_async.cli``, and
SIGINT stopping an exec's sandbox.

Local sandboxes made here use a private registry (``--state-dir``), so ``list`` and
``sweep`` see only this test's sandboxes, whatever else runs on the machine.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from adversarial.conftest import bwrap_problem, host_processes_matching
from guards import HANG_GUARD_SECONDS
from k8s.conftest import TEST_IMAGE, BackendFactory, k8s_server, make_backend, needs_bwrap, wait_no_pods  # noqa: F401
from k8s.server import KubeTestServer

from cwsandbox_async import Session, Timeouts
from cwsandbox_async.testing.contract import make_spec

ROOT = Path(__file__).resolve().parent.parent
#: The documented exit codes (pinned here; the test process does not import the CLI module).
EXIT_CODES = (0, 1, 2, 3, 4, 124, 125, 126, 127, 130)
local_only = pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))


@dataclass
class Ran:
    code: int
    out: bytes
    err: bytes

    @property
    def stdout(self) -> str:
        return self.out.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.out)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["KUBECONFIG"] = "/nonexistent/kubeconfig"  # never pick up a real cluster by accident
    e.pop("KUBERNETES_SERVICE_HOST", None)
    return e


@pytest.fixture(autouse=True)
def _no_real_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process CLI sees the environment ``env`` gives the subprocess one."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


async def cli_process(*args: str, stdin: bytes | None = None, within: float = HANG_GUARD_SECONDS) -> Ran:
    """The CLI as a user runs it: ``python -m cwsandbox_async.cli`` in a new process."""
    with anyio.fail_after(within):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cwsandbox_async.cli",
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
            env=env(),
        )
        out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return Ran(proc.returncode, out, err)


def _main_in_this_process(args: tuple[str, ...], stdin: bytes | None) -> Ran:
    from cwsandbox_async.cli import main

    streams = sys.stdin, sys.stdout, sys.stderr
    out, err = io.BytesIO(), io.BytesIO()
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin or b""))
    sys.stdout = io.TextIOWrapper(out, write_through=True)
    sys.stderr = io.TextIOWrapper(err, write_through=True)
    try:
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        sys.stdout.flush()
        sys.stderr.flush()
        return Ran(code, out.getvalue(), err.getvalue())
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams


async def cli(*args: str, stdin: bytes | None = None, within: float = HANG_GUARD_SECONDS) -> Ran:
    """The CLI's ``main`` with these arguments, in a worker thread (its own event loop, as in a process)."""
    with anyio.fail_after(within):
        return await anyio.to_thread.run_sync(_main_in_this_process, args, stdin, abandon_on_cancel=True)


@pytest.fixture
def state(tmp_path: Path) -> list[str]:
    """``--state-dir`` of a private registry for this test."""
    return ["--state-dir", str(tmp_path / "state")]


async def test_help_lists_the_commands_and_every_exit_code() -> None:
    r = await cli_process("--help")  # the entry point itself, exit code through sys.exit
    assert r.code == 0
    for command in ("doctor", "list", "sweep", "exec", "bench"):
        assert command in r.stdout
    listed = r.stdout.split("exit codes:")[1].split("examples:")[0]
    codes = [int(line.split()[0]) for line in listed.splitlines() if line.strip()[:1].isdigit()]
    assert tuple(codes) == EXIT_CODES
    r = await cli("exec", "--help")
    assert r.code == 0 and "--timeout" in r.stdout and "exit codes" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep"], "needs --tag and/or --older-than"),
        (["sweep", "--tag", "x", "--older-than", "2q"], "not a duration"),
        (["--backend", "kubernetes", "--isolation", "none", "list"], "only for --backend local"),
        (["exec"], "exec needs a command"),
        (["exec", "--cwd", "relative", "--", "true"], "must be absolute"),
        (["list", "--tag", "bad tag!"], "invalid tag"),
        (["frobnicate"], "invalid choice"),
    ],
)
async def test_usage_errors_exit_2_with_a_helpful_message(args: list[str], message: str, state: list[str]) -> None:
    full = [*args[:1], *state, *args[1:]] if args[0] in ("sweep", "exec", "list") else args
    r = await cli(*full)
    assert r.code == 2, (r.code, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr


async def test_a_missing_backend_is_exit_3_and_json_says_why() -> None:
    r = await cli_process("--backend", "kubernetes", "list", "--json")  # a failing exit code through sys.exit
    assert r.code == 3
    doc = r.json()
    assert doc["exit_code"] == 3 and doc["error"]["type"] == "SandboxBackendUnavailableError"
    assert "kubeconfig" in doc["error"]["message"] and "kubeconfig" in r.stderr


@local_only
async def test_exec_streams_output_and_exits_with_the_commands_status(state: list[str]) -> None:
    r = await cli("exec", *state, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (r.code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    r = await cli("exec", *state, "--shell", "--env", "GREETING=hi there", "--", 'echo "$GREETING"; kill -9 $$')
    assert r.code == 128 + 9 and r.stdout == "hi there\n"
    blob = os.urandom(100_000) + b"\x00\xff"
    r = await cli("exec", *state, "--stdin", "--", "cat", stdin=blob)
    assert r.code == 0 and r.out == blob
    r = await cli("exec", *state, "--timeout", "1", "--", "sh", "-c", "echo started; sleep 30")
    assert r.stdout == "started\n" and "timed out" in r.stderr
    # 124 as timeout(1) says; 125 when it spent so much of its second waiting for a CPU that the
    # timeout cannot be blamed on it (a busy machine), and the message says so
    assert r.code == 124 or (r.code == 125 and "starved of CPU" in r.stderr), r


@local_only
async def test_exec_agrees_with_the_api_on_string_commands_and_missing_programs(state: list[str]) -> None:
    """One argument is a shell command line (as ``Sandbox.exec(str)``); a missing program is 127, as in sh."""
    r = await cli("exec", *state, "echo hi | tr a-z A-Z")
    assert (r.code, r.stdout) == (0, "HI\n")
    r = await cli("exec", *state, "--", "echo", "hi | tr a-z A-Z")  # several words: argv, no shell
    assert (r.code, r.stdout) == (0, "hi | tr a-z A-Z\n")
    r = await cli("exec", *state, "--argv", "--", "echo hi")  # one word, but a program name
    assert r.code == 127 and "not found" in r.stderr
    r = await cli("exec", *state, "--", "/nonexistent/program", "x")
    assert r.code == 127 and "not found" in r.stderr
    r = await cli("exec", *state, "nonexistent-program")
    assert r.code == 127 and "not found" in r.stderr
    r = await cli("exec", *state, "--", "/etc/passwd", "x")
    assert r.code == 126 and "permission denied" in r.stderr
    r = await cli("exec", *state, "--shell", "--argv", "--", "true")
    assert r.code == 2 and "contradict" in r.stderr
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Session(backend="local") as s, s.sandbox() as sb:
            codes = [(await sb.exec(c)).returncode for c in (["/nonexistent/program", "x"], "nonexistent-program")]
            codes.append((await sb.exec(["/etc/passwd"])).returncode)
    assert codes == [127, 127, 126]  # the same codes from the API


@local_only
async def test_exec_json(state: list[str]) -> None:
    r = await cli("exec", *state, "--json", "--", "sh", "-c", "printf 'ok\\377'; echo warn >&2; exit 7")
    doc = r.json()
    assert r.code == 7 and doc["exit_code"] == 7 and doc["returncode"] == 7 and doc["error"] is None
    assert base64.b64decode(doc["stdout_base64"]) == b"ok\xff" and doc["stdout"] == "ok\ufffd"
    assert doc["stderr"] == "warn\n" and "stderr_base64" not in doc
    assert doc["sandbox_id"].startswith("sbx-") and doc["timed_out"] is False
    r = await cli("exec", *state, "--json", "--timeout", "1", "--max-output-bytes", "4096", "--", "yes")
    doc = r.json()
    # past the cap the pipe is closed and the command killed: it dies of whichever comes first
    assert r.code in (128 + signal.SIGKILL, 128 + signal.SIGPIPE), r
    assert doc["truncated"] and len(doc["stdout"]) == 4096
    r = await cli("exec", *state, "--json", "--timeout", "1", "--", "sleep", "30")
    doc = r.json()
    assert doc["error"]["type"] == "SandboxTimeoutError"
    # as above: 124, or 125 (an error, not the command's timeout) when it was starved of CPU
    assert (r.code == 124 and doc["timed_out"]) or (r.code == 125 and "starved of CPU" in doc["error"]["message"]), doc
    # Nothing is left behind by any of them.
    r = await cli("list", *state, "--json")
    assert r.code == 0 and r.json()["sandboxes"] == []


CRASHING_DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    from cwsandbox_async.backends.local import LocalBackend
    from cwsandbox_async.testing.contract import make_spec

    async def main():
        backend = LocalBackend(state_dir=sys.argv[1])
        for _ in range(2):
            spec = make_spec(sys.argv[2])
            await backend.create(spec)
            print(spec.sandbox_id, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def crashed_driver(state_dir: str, tag: str) -> list[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHING_DRIVER, state_dir, tag, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            ids = [(await proc.stdout.readline()).decode().strip() for _ in range(2)]
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    return ids


@local_only
async def test_list_and_sweep_find_and_remove_a_crashed_drivers_sandboxes(state: list[str]) -> None:
    tag = f"cli-{uuid.uuid4().hex[:8]}"
    ids = await crashed_driver(state[1], tag)
    # they die with their driver, once the kernel has torn their namespaces down
    with anyio.fail_after(HANG_GUARD_SECONDS):
        while True:
            r = await cli("list", *state, "--tag", tag, "--json")
            rows = r.json()["sandboxes"]
            if all(x["status"] != "running" for x in rows):
                break
            await anyio.sleep(0.1)
    assert r.code == 0 and sorted(x["sandbox_id"] for x in rows) == sorted(ids)
    assert all(x["owner_alive"] is False and x["status"] == "failed" and x["tags"] == [tag] for x in rows), rows
    r = await cli("list", *state, "--tag", tag)
    assert all(i in r.stdout for i in ids) and "gone" in r.stdout
    r = await cli("sweep", *state, "--tag", tag, "--older-than", "1h", "--json")
    assert r.code == 0 and r.json()["swept"] == [] and r.json()["matched"] == []  # too young
    r = await cli("sweep", *state, "--tag", tag, "--dry-run")
    assert r.code == 0 and "would stop 2" in r.stdout
    assert len((await cli("list", *state, "--tag", tag, "--json")).json()["sandboxes"]) == 2
    r = await cli("sweep", *state, "--tag", tag, "--json")
    assert r.code == 0 and sorted(r.json()["swept"]) == sorted(ids) and r.json()["failed"] == []
    r = await cli("list", *state, "--json")
    assert r.json()["sandboxes"] == []
    assert all(host_processes_matching(i.encode()) == [] for i in ids)


def sandbox_sleeps(marker: str) -> list[int]:
    """Processes whose command line is exactly ``sleep <marker>`` (not the CLI that asked for one)."""
    want = f"sleep\0{marker}\0".encode()
    out = []
    for pid in host_processes_matching(marker.encode()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == want:
                    out.append(pid)
        except OSError:
            continue
    return out


@local_only
async def test_interrupting_exec_stops_its_sandbox(state: list[str]) -> None:
    marker = str(9000 + os.getpid() % 900)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cwsandbox_async.cli", "exec", *state, "--", "sleep", marker,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=ROOT, env=env(),
    )  # fmt: skip
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):  # an interpreter, the package and a sandbox start
            while not sandbox_sleeps(marker):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        with anyio.fail_after(Timeouts().close_seconds + 10):  # the CLI session's close budget, then its exit
            assert proc.stderr is not None
            err = await proc.stderr.read()
            code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 130, err
    assert b"interrupted" in err and b"Traceback" not in err
    assert sandbox_sleeps(marker) == []
    assert (await cli("list", *state, "--json")).json()["sandboxes"] == []


def checks(section: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in section["checks"]}


HOLD_HERE = (
    "sandbox starts",
    "user namespace",
    "pid namespace",
    "no network",
    "secrets masked",
    "read-only root",
    "process limit",
    "memory limit",
    "/tmp size limit",
    "output cap",
    "timeout kills the tree",
    "cleanup",
)


@local_only
async def test_doctor_reports_what_this_machine_enforces(state: list[str]) -> None:
    r = await cli("doctor", *state, "--json")
    doc = r.json()
    local = checks(doc["local"])
    assert all(c["probe"] for c in local.values()), "every claim names the probe behind it"
    for name in HOLD_HERE:
        assert local[name]["status"] == "ok", local[name]
    assert doc["local"]["facts"]["isolation"] == "unshare"  # born from the template
    assert checks(doc["kubernetes"])["config"]["status"] == "skip"  # no kubeconfig: skipped, not failed
    assert r.code == (0 if doc["ok"] else 1)
    assert doc["ok"] == all(c["status"] != "fail" for s in ("local", "kubernetes") for c in doc[s]["checks"])
    human = await cli("doctor", *state, "--skip-kubernetes")
    assert "no network" in human.stdout and "probe:" in human.stdout and "limits enforced by" in human.stdout


@local_only
async def test_doctor_fails_where_there_is_no_isolation(state: list[str]) -> None:
    """The probes are real: without isolation they see the network, the secrets and the host."""
    with pytest.warns(RuntimeWarning, match="NOT isolated"):  # said once, as a backend without isolation is made
        r = await cli("doctor", *state, "--isolation", "none", "--skip-kubernetes", "--json")
    assert r.code == 1
    local = checks(r.json()["local"])
    assert local["sandbox starts"]["status"] == "ok", local["sandbox starts"]["detail"]
    for name in ("user namespace", "pid namespace", "no network", "secrets masked", "read-only root"):
        assert local[name]["status"] == "fail", local[name]
    assert "1.1.1.1" not in local["no network"]["detail"]  # never tried from a sandbox that has a route


async def crashed_driver_pods(make_backend: BackendFactory, tag: str, count: int) -> list[str]:  # noqa: F811
    """Pods left by a driver that died without cleaning up (no destroy, no close-time sweep)."""
    dead = make_backend(sweep_on_close=False)
    names = []
    for _ in range(count):
        spec = make_spec(tag)
        await dead.create(spec)
        names.append(spec.sandbox_id)
    await dead.aclose()
    return names


@needs_bwrap
async def test_doctor_list_and_sweep_on_kubernetes(
    k8s_server: KubeTestServer,  # noqa: F811
    make_backend: BackendFactory,  # noqa: F811
) -> None:
    k8s = ["--backend", "kubernetes", "--server", k8s_server.url, "--namespace", "default", "--image", TEST_IMAGE]
    r = await cli(*k8s, "doctor", "--json")
    section = checks(r.json()["kubernetes"])
    assert r.code == 0 and [c["status"] for c in section.values()] == ["ok", "ok", "ok"], section
    tag = f"cli-k8s-{uuid.uuid4().hex[:8]}"
    names = await crashed_driver_pods(make_backend, tag, 2)
    r = await cli(*k8s, "list", "--tag", tag, "--json")
    assert r.code == 0 and sorted(x["sandbox_id"] for x in r.json()["sandboxes"]) == sorted(names)
    r = await cli(*k8s, "sweep", "--tag", tag, "--json")
    assert r.code == 0 and sorted(r.json()["swept"]) == sorted(names)
    await wait_no_pods(k8s_server)
    r = await cli("--backend", "kubernetes", "--server", "http://127.0.0.1:9", "doctor", "--json")
    assert r.code == 1 and checks(r.json()["kubernetes"])["reachable"]["status"] == "fail"


@needs_bwrap
async def test_sweep_on_kubernetes_is_one_deletecollection(
    k8s_server: KubeTestServer,  # noqa: F811
    make_backend: BackendFactory,  # noqa: F811
) -> None:
    """The CLI's sweep goes through ``Backend.sweep``: one DELETE of the pod collection, by label, and no
    DELETE of any single pod (counted on the server)."""
    tag = f"cli-dc-{uuid.uuid4().hex[:8]}"
    names = await crashed_driver_pods(make_backend, tag, 3)
    before = len(k8s_server.requests)
    k8s = ["--backend", "kubernetes", "--server", k8s_server.url, "--namespace", "default", "--image", TEST_IMAGE]
    r = await cli(*k8s, "sweep", "--tag", tag, "--json")
    assert r.code == 0 and sorted(r.json()["swept"]) == sorted(names), r.stderr
    deletes = [c for c in k8s_server.requests[before:] if c.method == "DELETE"]
    assert len(deletes) == 1, [c.path for c in deletes]
    (call,) = deletes
    assert call.path.endswith("/pods") and "tag.cwsandbox.io/" in (call.param("labelSelector") or "")
    await wait_no_pods(k8s_server)


async def test_bench_runs_the_harness_and_passes_its_exit_code_through() -> None:
    r = await cli_process("bench", "--only", "no-such-benchmark")  # bench runs the harness as a process
    assert r.code == 2 and "unknown benchmark" in r.stderr
