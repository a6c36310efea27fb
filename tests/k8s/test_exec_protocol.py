"""The exec WebSocket protocol end to end: v5 and v4, framing, stdin EOF, big payloads, exit codes."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxNotRunningError, SandboxValidationError
from cwsandbox_async.backends.kubernetes import KubernetesBackend
from cwsandbox_async.backends.kubernetes._exec import ExecStatusError, exit_code
from cwsandbox_async.testing.contract import make_request, make_spec

from .conftest import TEST_IMAGE, needs_bwrap, wait_for
from .server import KubeTestServer

pytestmark = needs_bwrap


@pytest.fixture(params=["v5", "v4"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[KubeTestServer]:
    protocols = ("v5.channel.k8s.io", "v4.channel.k8s.io") if request.param == "v5" else ("v4.channel.k8s.io",)
    srv = KubeTestServer(protocols=protocols)
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def sandbox(server: KubeTestServer) -> AsyncIterator[tuple[KubernetesBackend, str]]:
    backend = KubernetesBackend(server=server.url, image=TEST_IMAGE)
    spec = make_spec("proto")
    with anyio.fail_after(HANG_GUARD_SECONDS):
        await backend.create(spec)
    yield backend, spec.sandbox_id
    await backend.destroy(spec.sandbox_id)
    await backend.aclose()


async def run(sb: tuple[KubernetesBackend, str], *argv: str, **kw: Any) -> Any:
    backend, sid = sb
    with anyio.fail_after(HANG_GUARD_SECONDS):
        return await backend.exec(sid, make_request(*argv, **kw))


async def test_the_upgrade_request_is_what_kubectl_sends(
    server: KubeTestServer, sandbox: tuple[KubernetesBackend, str]
) -> None:
    await run(sandbox, "echo", "a b", "c")
    (req,) = server.calls("GET", r"/exec$")
    offered = [p.strip() for p in req.headers["Sec-WebSocket-Protocol"].split(",")]
    assert offered == ["v5.channel.k8s.io", "v4.channel.k8s.io"]
    assert server.exec_protocols == [server.protocols[0]]  # v5 when offered by the server, else v4
    assert req.headers["Upgrade"].lower() == "websocket"
    assert (req.param("stdin"), req.param("stdout"), req.param("stderr"), req.param("tty")) == ("true",) * 3 + (
        "false",
    )
    assert req.param("container") == "main"
    commands = [v for k, v in req.query if k == "command"]
    assert commands[:2] == ["/bin/sh", "-c"] and commands[-3:] == ["echo", "a b", "c"]


async def test_stdin_eof_on_both_protocols(sandbox: tuple[KubernetesBackend, str]) -> None:
    r = await run(sandbox, "/bin/sh", "-c", "wc -c; cat >/dev/null; echo done", stdin=b"12345")
    assert r.stdout == b"5\ndone\n" and r.returncode == 0
    r = await run(sandbox, "cat")  # no stdin at all: EOF at once, no hang
    assert r.stdout == b""


async def test_large_stdin_goes_in_chunks_and_large_output_arrives_whole(
    server: KubeTestServer, sandbox: tuple[KubernetesBackend, str]
) -> None:
    data = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB, not a multiple of the chunk size
    r = await run(sandbox, "cat", stdin=data, max_output=8 << 20)
    assert r.stdout == data
    assert 0 < server.max_stdin_frame <= 128 * 1024
    r = await run(sandbox, "head", "-c", str(6 << 20), "/dev/zero", max_output=8 << 20)  # > aiohttp's 4 MiB default
    assert len(r.stdout) == 6 << 20 and not r.truncated


async def test_utf8_split_across_frames_stays_intact(sandbox: tuple[KubernetesBackend, str]) -> None:
    r = await run(sandbox, "/bin/sh", "-c", r"printf '\342\202'; sleep 0.2; printf '\254\n'")
    assert r.stdout == "€\n".encode()


async def test_output_streams_while_the_command_runs(sandbox: tuple[KubernetesBackend, str]) -> None:
    backend, sid = sandbox
    seen: list[tuple[float, str, bytes]] = []

    async def on_output(stream: Any, data: bytes) -> None:
        seen.append((time.monotonic(), stream, data))

    start = time.monotonic()
    with anyio.fail_after(HANG_GUARD_SECONDS):
        r = await backend.exec(sid, make_request("/bin/sh", "-c", "echo first; sleep 1; echo second >&2"), on_output)
    end = time.monotonic()
    assert seen[0][1:] == ("stdout", b"first\n") and seen[0][0] < end - 0.5 and seen[0][0] > start
    assert r.stderr == b"second\n"


async def test_env_and_cwd_edge_cases(sandbox: tuple[KubernetesBackend, str]) -> None:
    r = await run(sandbox, "printenv", "V", env={"V": "a b; $(x) 'q' \"w\"\nline2"})
    assert r.stdout == b"a b; $(x) 'q' \"w\"\nline2\n"
    r = await run(sandbox, "pwd", cwd="/no/such/dir")
    assert r.returncode == 127
    r = await run(sandbox, "/bin/sh", "-c", "exit 124")  # a real 124 before the deadline is not a timeout
    assert (r.returncode, r.timed_out) == (124, False)


async def test_a_command_too_long_for_the_url_is_refused(sandbox: tuple[KubernetesBackend, str]) -> None:
    with pytest.raises(SandboxValidationError, match="stdin"):
        await run(sandbox, "echo", "x" * (600 * 1024))


async def test_a_long_command_line_goes_through(sandbox: tuple[KubernetesBackend, str]) -> None:
    arg = "x" * 20_000  # far past aiohttp's 8 KiB request line, well within Go's 1 MiB
    r = await run(sandbox, "/bin/sh", "-c", 'printf %s "$1" | wc -c', "sh", arg)
    assert r.stdout == b"20000\n"


async def test_the_session_header_is_not_output(sandbox: tuple[KubernetesBackend, str]) -> None:
    r = await run(sandbox, "/bin/sh", "-c", "echo 4242 >&2; echo out")
    assert (r.stdout, r.stderr) == (b"out\n", b"4242\n")  # the program's own digits stay


async def test_a_command_killed_by_a_signal_in_a_live_pod_is_its_own_exit(
    sandbox: tuple[KubernetesBackend, str],
) -> None:
    r = await run(sandbox, "/bin/sh", "-c", "kill -9 $$")
    assert (r.returncode, r.timed_out, r.oom_killed) == (137, False, False)


async def test_exec_into_a_missing_pod_is_not_running(server: KubeTestServer) -> None:
    backend = KubernetesBackend(server=server.url, image=TEST_IMAGE)
    try:
        with pytest.raises(SandboxNotRunningError):
            await backend.exec("sbx-doesnotexist", make_request("true"))
    finally:
        await backend.aclose()


def test_exit_code_from_status() -> None:
    assert exit_code({"metadata": {}, "status": "Success"}) == 0
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "Other", "message": "x"}, {"reason": "ExitCode", "message": "42"}]},
    }
    assert exit_code(failure) == 42  # not causes[0] (kubernetes-client/python#1840)
    for bad in (
        {"status": "Failure", "reason": "InternalError", "code": 500, "message": "executable file not found"},
        {"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "not a number"}]}},
        {},
    ):
        with pytest.raises(ExecStatusError):
            exit_code(bad)


async def raw_exec(server: KubeTestServer, pod: str, protocols: tuple[str, ...], command: str) -> list[Any]:
    """An exec with a bare aiohttp socket: the frames as the server sends them."""
    import aiohttp

    url = f"{server.url}/api/v1/namespaces/default/pods/{pod}/exec"
    params = [("command", "/bin/sh"), ("command", "-c"), ("command", command), ("stdin", "true"), ("stdout", "true")]
    frames: list[Any] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url, params=params, protocols=protocols) as ws:
        await ws.send_str("\x00from a text frame")  # the Go server reads TEXT frames like BINARY ones
        await ws.send_bytes(b"\xff\x00")
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async for msg in ws:
                frames.append(msg.data)
    return frames


async def test_text_stdin_frames_are_read_like_binary_ones(
    server: KubeTestServer, sandbox: tuple[KubernetesBackend, str]
) -> None:
    if server.protocols[0].startswith("v4"):
        pytest.skip("v4 cannot end stdin: the command would not see EOF")
    frames = await raw_exec(server, sandbox[1], ("v5.channel.k8s.io",), "cat")
    assert b"\x01from a text frame" in frames and frames[-1].startswith(b"\x03")


async def test_a_container_that_is_not_running_fails_after_the_upgrade(server: KubeTestServer) -> None:
    """A pod that exists but whose container never started (created here, not through the backend,
    whose failed create deletes it: the exec would then race that delete)."""
    import aiohttp

    from cwsandbox_async.backends.kubernetes._manifest import build_pod

    backend = KubernetesBackend(server=server.url, image="registry.test/fault-stuck")
    spec = make_spec("stuck")
    pod = build_pod(spec, backend.options, namespace="default", driver=backend.driver_id)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.url}/api/v1/namespaces/default/pods", json=pod) as resp,
    ):
        assert resp.status == 201, await resp.text()
    try:
        await wait_for(lambda: bool(server.pod(spec.sandbox_id)["spec"].get("nodeName")))  # scheduled, never started
        frames = await raw_exec(server, spec.sandbox_id, server.protocols, "true")
        status = json.loads(frames[-1][1:])
        assert frames[0] == b"\x01" and frames[-1][:1] == b"\x03"  # upgraded, then told on the status channel
        assert (status["reason"], status["code"]) == ("InternalError", 500)
        assert 'container not found ("main")' in status["message"]
    finally:
        await backend.destroy(spec.sandbox_id)
        await backend.aclose()


async def test_an_unsupported_subprotocol_is_refused(
    server: KubeTestServer, sandbox: tuple[KubernetesBackend, str]
) -> None:
    import aiohttp

    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await raw_exec(server, sandbox[1], ("channel.k8s.io",), "true")
    assert info.value.status == 403
