"""Exec on the CoreWeave backend: byte-exact output, partial output on timeout, the cap inside the sandbox,
exclusive, the CPU budget, and what the service was sent."""

from __future__ import annotations

import time

import anyio
import pytest
import structlog

from cwsandbox_async._types import ExecRequest, StreamName
from cwsandbox_async.testing.contract import make_request, make_spec
from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

from .conftest import BackendFactory

# bytes 0..255, then a euro sign split across two writes (and so across two output frames)
BINARY = (
    "import sys, time; o = sys.stdout.buffer; o.write(bytes(range(256))); o.flush(); "
    "o.write(b'\\xe2\\x82'); o.flush(); time.sleep(0.2); o.write(b'\\xac!'); o.flush()"
)
EXPECTED = bytes(range(256)) + "€!".encode()


@pytest.mark.parametrize("exec_rpc", ["unary", "stream"])
async def test_output_is_byte_exact(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory, exec_rpc: str
) -> None:
    backend = make_backend(exec_rpc=exec_rpc)
    spec = make_spec("bytes")
    await backend.create(spec)
    chunks: list[bytes] = []

    async def on_output(stream: StreamName, data: bytes) -> None:
        chunks.append(data)

    r = await backend.exec(spec.sandbox_id, make_request("python3", "-c", BINARY), on_output)
    assert r.stdout == EXPECTED
    assert b"".join(chunks) == EXPECTED
    if exec_rpc == "stream":
        assert len(chunks) >= 2  # it really streamed, and the split character survived
    await backend.destroy(spec.sandbox_id)


@pytest.mark.parametrize("exec_rpc", ["unary", "stream"])
async def test_timeout_keeps_partial_output(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory, exec_rpc: str
) -> None:
    backend = make_backend(exec_rpc=exec_rpc)
    spec = make_spec("partial")
    await backend.create(spec)
    start = time.monotonic()
    r = await backend.exec(spec.sandbox_id, make_request("/bin/sh", "-c", "echo before; sleep 300", timeout=1.0))
    assert (r.timed_out, r.stdout) == (True, b"before\n")
    assert time.monotonic() - start < 300  # ended by its timeout, not by the command (8.2 s at load 10 once)
    await backend.destroy(spec.sandbox_id)


async def test_output_cap_stops_a_flood_inside_the_sandbox(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    """The service drains past max_output_bytes; the wrapper's cap is what ends ``yes``."""
    backend = make_backend()
    spec = make_spec("flood")
    await backend.create(spec)
    r = await backend.exec(spec.sandbox_id, make_request("yes", max_output=4096, timeout=20))
    assert (r.truncated, r.timed_out, len(r.stdout)) == (True, False, 4096)
    assert r.returncode == -13  # SIGPIPE once the cap's reader left
    (answer,) = cw_server.service.exec_responses
    assert answer.stdout_bytes_produced <= 4097  # stopped at the cap, not after the server's 64 MiB drain
    await backend.destroy(spec.sandbox_id)


async def test_exclusive_kills_everything_else(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend()
    spec = make_spec("exclusive")
    await backend.create(spec)
    sid = spec.sandbox_id
    result: dict[str, object] = {}

    async def sleeper() -> None:
        result["sleeper"] = await backend.exec(sid, make_request("sleep", "30", timeout=40))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper)
        await anyio.sleep(1.0)
        base = make_request("echo", "alone")
        alone = await backend.exec(sid, ExecRequest(**{**_fields(base), "exclusive": True}))
        assert alone.stdout == b"alone\n"
    ex = result["sleeper"]
    assert getattr(ex, "returncode", None) not in (0, None)  # killed: left alone, its sleep ends with 0
    after = await backend.exec(sid, make_request("echo", "usable"))
    assert after.stdout == b"usable\n"
    await backend.destroy(sid)


async def test_cpu_budget_is_enforced(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend()
    spec = make_spec("cpu")
    await backend.create(spec)
    base = make_request("python3", "-c", "while True: pass", timeout=30)
    r = await backend.exec(spec.sandbox_id, ExecRequest(**{**_fields(base), "cpu_seconds": 1.0}))
    assert (r.cpu_exceeded, r.timed_out, r.returncode) == (True, False, -24)
    await backend.destroy(spec.sandbox_id)


async def test_what_the_service_was_sent(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend()
    spec = make_spec("sent", env={"SANDBOX_ENV": "1"}, max_lifetime_seconds=90.5)
    await backend.create(spec)
    (create,) = cw_server.service.calls("CreateSandbox")
    s = create.sandbox.spec
    assert create.request_id
    assert s.max_lifetime_seconds == 91
    assert s.network.deny_egress and s.network.deny_ingress
    c = s.containers[0]
    assert c.image == "python:3.11"
    assert dict(c.environment_variables) == {"SANDBOX_ENV": "1"}
    assert [c.command, *c.args] == ["/bin/sh", "-c", "exec sleep 2147483647"]  # PID 1 without handlers
    assert c.resource_requirements.limits.memory == "1024Mi"
    assert [m.mount_path for m in c.volume_mounts] == ["/workspace"]
    await backend.exec(spec.sandbox_id, make_request("true", env={"PER_EXEC": "x"}))
    (ex,) = cw_server.service.calls("Exec")
    assert dict(ex.env) == {"PER_EXEC": "x"}
    assert ex.command[:2] == ["/bin/sh", "-c"] and ex.command[-1] == "true"
    await backend.destroy(spec.sandbox_id)
    assert len(cw_server.service.calls("GetSandbox")) == 0


def _fields(req: ExecRequest) -> dict[str, object]:
    return {f: getattr(req, f) for f in req.__slots__}  # type: ignore[attr-defined]


async def test_unary_exec_unimplemented_falls_back_to_stream_once(
    cw_sdk_server: CoreWeaveTestServer, make_sdk_backend: BackendFactory
) -> None:
    """A service that does not serve unary Exec (as the SDK never calls it): StreamExec, asked once, logged once."""
    backend = make_sdk_backend()  # exec_rpc="auto": unary where it is served
    spec = make_spec("fallback")
    await backend.create(spec)
    with structlog.testing.capture_logs() as logs:
        for i in range(3):
            r = await backend.exec(spec.sandbox_id, make_request("/bin/sh", "-c", f"echo {i}; exit {i}"))
            assert (r.returncode, r.stdout) == (i, f"{i}\n".encode())
    service = cw_sdk_server.service
    assert len(service.calls("Exec")) == 1
    assert len(service.calls("StreamExec")) == 3
    assert [e["event"] for e in logs if "unary Exec" in e["event"]] == [
        "coreweave service does not serve unary Exec; using StreamExec"
    ]
    await backend.destroy(spec.sandbox_id)
    await backend.aclose()  # PurgeSandboxes is not served either: the close deletes one by one
    assert service.live() == []


async def test_python_resolves_in_the_test_servers_sandboxes(
    cw_sdk_server: CoreWeaveTestServer, make_sdk_backend: BackendFactory
) -> None:
    """The guide runs ``python``; a host with only ``python3`` still runs it (the sandbox's PATH ends in a shim)."""
    backend = make_sdk_backend()
    spec = make_spec("python")
    await backend.create(spec)
    r = await backend.exec(spec.sandbox_id, make_request("python", "-c", "print(6*7)"))
    assert (r.returncode, r.stdout) == (0, b"42\n")
    await backend.destroy(spec.sandbox_id)


async def test_stream_exec_sends_env_and_stdin_as_the_sdk_does(
    cw_sdk_server: CoreWeaveTestServer, make_sdk_backend: BackendFactory
) -> None:
    """Without stdin: the init alone, then the half-close (no ExecStreamClose). With stdin: chunks, then a close."""
    backend = make_sdk_backend(exec_rpc="stream")
    spec = make_spec("sent-stream")
    await backend.create(spec)
    r = await backend.exec(spec.sandbox_id, make_request("printenv", "PER_EXEC", env={"PER_EXEC": "x"}))
    assert r.stdout == b"x\n"
    service = cw_sdk_server.service
    (first,) = service.calls("StreamExec")
    assert dict(first.init.env) == {"PER_EXEC": "x"}
    assert service.calls("StreamExec.message") == []  # nothing after the init: the half-close ends it
    data = bytes(range(256)) * 1024  # 256 KiB: four stdin chunks
    r = await backend.exec(spec.sandbox_id, ExecRequest(**{**_fields(make_request("cat")), "stdin": data}))
    assert r.stdout == data
    kinds = [m.WhichOneof("message") for m in service.calls("StreamExec.message")]
    assert kinds == ["stdin"] * 4 + ["close"]
    await backend.destroy(spec.sandbox_id)
