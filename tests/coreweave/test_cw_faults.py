"""The backend against an unreliable service: retries, readiness batching, lost deletes, cut streams, deaths."""

from __future__ import annotations

import itertools
import time

import anyio
import grpc
import pytest

from cwsandbox_async import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxNotRunningError,
    SandboxTransportError,
)
from cwsandbox_async._types import StreamName
from cwsandbox_async.testing.contract import make_request, make_spec
from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

from .conftest import BackendFactory


async def test_create_is_retried_with_one_idempotency_key(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend()
    cw_server.service.faults.unavailable["CreateSandbox"] = 1  # refused
    cw_server.service.faults.lose_responses["CreateSandbox"] = 1  # served, but the answer was lost
    spec = make_spec("retry")
    await backend.create(spec)
    creates = cw_server.service.calls("CreateSandbox")
    assert len(creates) == 3
    assert len({c.request_id for c in creates}) == 1
    assert len(cw_server.service.live()) == 1
    await backend.destroy(spec.sandbox_id)
    assert cw_server.service.live() == []


async def test_resource_exhausted_waits_the_retry_delay(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend()
    faults = cw_server.service.faults
    faults.exhausted["ListSandboxes"], faults.retry_delay = 2, 0.3
    assert await backend.list(["none"]) == []
    times = [r.at for r in cw_server.service.requests if r.method == "ListSandboxes"]
    assert len(times) == 3
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.28


async def test_retries_are_bounded(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend(max_retries=2, max_retry_delay_seconds=0.05)
    cw_server.service.faults.unavailable["CreateSandbox"] = 10
    with pytest.raises(SandboxBackendUnavailableError) as info:
        await backend.create(make_spec("bounded"))
    assert info.value.infrastructure is True
    assert len(cw_server.service.calls("CreateSandbox")) == 3


async def test_exec_is_resent_only_when_the_service_refused_it(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend()
    spec = make_spec("exec-retry")
    await backend.create(spec)
    faults = cw_server.service.faults
    faults.exhausted["Exec"] = 1  # refused: safe to send again
    r = await backend.exec(spec.sandbox_id, make_request("echo", "ok"))
    assert r.stdout == b"ok\n"
    assert len(cw_server.service.calls("Exec")) == 2
    faults.bare_unavailable["Exec"] = 1  # the connection broke: the command may have run; never run it twice
    with pytest.raises(SandboxTransportError) as info:
        await backend.exec(spec.sandbox_id, make_request("echo", "once"))
    assert info.value.infrastructure is True
    assert len(cw_server.service.calls("Exec")) == 3
    await backend.destroy(spec.sandbox_id)


async def test_readiness_is_one_list_per_round_for_all(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend(ready_poll_seconds=0.05)
    cw_server.service.faults.start_delay = 0.5
    specs = [make_spec("slow") for _ in range(8)]
    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        for spec in specs:
            tg.start_soon(backend.create, spec)
    elapsed = time.monotonic() - start
    assert elapsed >= 0.5
    calls = backend.channel.calls if backend.channel else {}
    assert calls.get("GetSandbox", 0) == 0
    assert backend.readiness is not None
    # one list per round for all 8 (a round waits ready_poll_seconds, however slow the machine)
    assert calls["ListSandboxes"] == backend.readiness.rounds <= elapsed / 0.05 + 1
    for spec in specs:
        await backend.destroy(spec.sandbox_id)


async def test_failed_start_is_a_creation_error_with_the_reason(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend()
    cw_server.service.faults.fail_start = "ErrImagePull: registry.invalid/nope"
    spec = make_spec("fail")
    with pytest.raises(SandboxCreationError) as info:
        await backend.create(spec)
    assert info.value.reason is not None and "ErrImagePull" in info.value.reason
    await backend.destroy(spec.sandbox_id)


async def test_cancelled_create_leaves_nothing(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend()
    cw_server.service.faults.start_delay = 5
    spec = make_spec("cancelled")
    with anyio.move_on_after(0.3):
        await backend.create(spec)
    await backend.destroy(spec.sandbox_id)
    assert cw_server.service.live() == []


async def test_lost_delete_is_swept_at_close(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend()
    spec = make_spec("lost")
    await backend.create(spec)
    cw_server.service.faults.lost_deletes = 1
    await backend.destroy(spec.sandbox_id)
    assert len(cw_server.service.live()) == 1  # the service said OK and kept it
    await backend.aclose()
    assert cw_server.service.live() == []
    assert len(cw_server.service.calls("PurgeSandboxes")) == 1


async def test_stream_cut_mid_output(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    """Aborted with UNAVAILABLE: the service failed (infrastructure). Ended OK without an exit status while the
    sandbox runs and a probe exec works: no evidence against the platform, so not infrastructure."""
    backend = make_backend()
    spec = make_spec("cut")
    await backend.create(spec)
    seen: list[bytes] = []

    async def on_output(stream: StreamName, data: bytes) -> None:
        seen.append(data)

    script = "for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done"
    for code, infrastructure in ((grpc.StatusCode.UNAVAILABLE, True), (None, False)):
        faults = cw_server.service.faults
        faults.cut_stream_after, faults.cut_code = 2, code
        seen.clear()
        with pytest.raises(SandboxTransportError) as info:
            await backend.exec(spec.sandbox_id, make_request("/bin/sh", "-c", script), on_output)
        assert info.value.infrastructure is infrastructure
        assert b"".join(seen) == b"line1\nline2\n"
    r = await backend.exec(spec.sandbox_id, make_request("echo", "after"))
    assert r.stdout == b"after\n"
    await backend.destroy(spec.sandbox_id)


MARKER = "END-MY-STREAM"


async def test_a_program_that_ends_its_stream_keeps_its_own_verdict(
    cw_sdk_server: CoreWeaveTestServer, make_sdk_backend: BackendFactory
) -> None:
    """The service ends the stream (OK, no exit status) when the program says so: the failure stays the
    program's (a probe exec shows the service and the sandbox work), never a masked one."""
    backend = make_sdk_backend()
    spec = make_spec("masked")
    await backend.create(spec)
    service = cw_sdk_server.service
    service.faults.end_stream_on = MARKER.encode()
    program = f"import sys; print('wrong answer'); sys.stdout.flush(); print('{MARKER}', flush=True); sys.exit(1)"
    with pytest.raises(SandboxTransportError, match="program's failure") as info:
        await backend.exec(spec.sandbox_id, make_request("python3", "-c", program))
    assert info.value.infrastructure is False
    probes = [c for c in service.calls("StreamExec") if c is not None and list(c.init.command) == ["true"]]
    assert len(probes) == 1  # the evidence was looked for
    service.faults.end_stream_on = None
    r = await backend.exec(spec.sandbox_id, make_request("echo", "still usable"))
    assert r.stdout == b"still usable\n"
    await backend.destroy(spec.sandbox_id)


async def test_a_lost_stream_is_infrastructure_when_the_probe_fails(
    cw_sdk_server: CoreWeaveTestServer, make_sdk_backend: BackendFactory
) -> None:
    """The same lost stream, but the service then fails the probe exec too: evidence the platform failed."""
    backend = make_sdk_backend()
    spec = make_spec("lost-stream")
    await backend.create(spec)
    faults = cw_sdk_server.service.faults
    faults.end_stream_on = MARKER.encode()

    async def on_output(stream: StreamName, data: bytes) -> None:
        faults.bare_unavailable["StreamExec"] = 1  # the next call (the probe): the service is down

    script = f"echo first; sleep 0.1; echo {MARKER}"
    with pytest.raises(SandboxTransportError, match="probe exec failed") as info:
        await backend.exec(spec.sandbox_id, make_request("/bin/sh", "-c", script), on_output)
    assert info.value.infrastructure is True
    assert faults.bare_unavailable["StreamExec"] == 0  # the probe went where the backend's execs go, and failed
    assert len(cw_sdk_server.service.calls("Exec")) == 1  # asked once (UNIMPLEMENTED), never again
    await backend.destroy(spec.sandbox_id)


async def test_stream_backpressure_is_the_output_cap(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend(exec_rpc="stream")
    spec = make_spec("bp")
    await backend.create(spec)
    cw_server.service.faults.stream_error_code = "STREAM_BACKPRESSURE"
    r = await backend.exec(spec.sandbox_id, make_request("echo", "x"))
    assert (r.truncated, r.returncode, r.timed_out) == (True, -9, False)
    await backend.destroy(spec.sandbox_id)


@pytest.mark.parametrize("exec_rpc", ["unary", "stream"])
async def test_oom_killed_sandbox_is_the_programs_outcome(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory, exec_rpc: str
) -> None:
    backend = make_backend(exec_rpc=exec_rpc)
    spec = make_spec("oom")
    await backend.create(spec)
    cw_server.service.faults.die_during_exec = "OOMKilled"
    r = await backend.exec(spec.sandbox_id, make_request("python3", "-c", "x = bytearray(1 << 40)"))
    assert (r.oom_killed, r.returncode) == (True, -9)
    await backend.destroy(spec.sandbox_id)


async def test_sandbox_that_died_for_outside_reasons_is_infrastructure(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend()
    spec = make_spec("evicted")
    await backend.create(spec)
    cw_server.service.faults.die_during_exec = "Evicted: node drained"
    with pytest.raises(SandboxNotRunningError, match="Evicted") as info:
        await backend.exec(spec.sandbox_id, make_request("true"))
    assert info.value.infrastructure is True
    await backend.destroy(spec.sandbox_id)


async def test_in_flight_cap_holds(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend(max_in_flight=2)
    spec = make_spec("cap")
    await backend.create(spec)
    await backend.exec(spec.sandbox_id, make_request("true"))  # the channel learns that Exec is served
    cw_server.service.faults.stall["Exec"] = 0.1
    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(backend.exec, spec.sandbox_id, make_request("true"))
    assert cw_server.service.peak["Exec"] == 2
    await backend.destroy(spec.sandbox_id)


async def test_bad_credentials_are_the_callers(make_backend: BackendFactory) -> None:
    async with CoreWeaveTestServer(api_key="right") as server:
        good = make_backend(base_url=server.url, api_key="right")
        assert await good.list(["x"]) == []
        assert server.service.requests[-1].metadata["authorization"] == "Bearer right"
        bad = make_backend(base_url=server.url, api_key="wrong")
        with pytest.raises(SandboxBackendUnavailableError) as info:
            await bad.list(["x"])
        assert info.value.infrastructure is False


async def test_a_lost_stream_whose_sandbox_then_died_of_oom_is_the_programs(
    cw_sdk_server: CoreWeaveTestServer, make_sdk_backend: BackendFactory
) -> None:
    """The probe fails because the sandbox went down meanwhile, OOM-killed: the program's outcome, not masked."""
    backend = make_sdk_backend()
    spec = make_spec("lost-oom")
    await backend.create(spec)
    faults = cw_sdk_server.service.faults
    faults.end_stream_on = MARKER.encode()

    async def on_output(stream: StreamName, data: bytes) -> None:
        faults.die_during_exec = "OOMKilled"  # the next call (the probe) finds the sandbox dying of OOM

    script = f"echo first; sleep 0.1; echo {MARKER}"
    r = await backend.exec(spec.sandbox_id, make_request("/bin/sh", "-c", script), on_output)
    assert (r.oom_killed, r.returncode) == (True, -9)
    await backend.destroy(spec.sandbox_id)
