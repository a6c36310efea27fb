"""Which exec RPC a channel learns, and how often it asks: one unary ``Exec`` for a first burst, not one per exec."""

from __future__ import annotations

import anyio
import pytest

from cwsandbox_async._types import ExecRequest
from cwsandbox_async.backends.coreweave import CoreWeaveBackend
from cwsandbox_async.testing.contract import make_request, make_spec
from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

from .conftest import BackendFactory

BURST = 12


async def _burst(backend: CoreWeaveBackend, sandbox_id: str) -> list[tuple[int, bytes]]:
    results: list[tuple[int, bytes]] = [(-1, b"")] * BURST

    async def one(i: int) -> None:
        r = await backend.exec(sandbox_id, make_request("/bin/sh", "-c", f"echo {i}; exit {i % 3}"))
        results[i] = (r.returncode, r.stdout)

    async with anyio.create_task_group() as tg:
        for i in range(BURST):
            tg.start_soon(one, i)
    return results


def _expected() -> list[tuple[int, bytes]]:
    return [(i % 3, f"{i}\n".encode()) for i in range(BURST)]


async def test_a_first_burst_asks_an_unserved_exec_once(
    cw_sdk_server: CoreWeaveTestServer, make_sdk_backend: BackendFactory
) -> None:
    """A service without unary Exec: the burst's one probe is answered UNIMPLEMENTED, every exec runs once on
    StreamExec (the probe's command too), and later execs never ask again."""
    backend = make_sdk_backend()  # exec_rpc="auto"
    spec = make_spec("burst")
    await backend.create(spec)
    assert await _burst(backend, spec.sandbox_id) == _expected()
    service = cw_sdk_server.service
    assert len(service.calls("Exec")) == 1
    assert len(service.calls("StreamExec")) == BURST
    assert await _burst(backend, spec.sandbox_id) == _expected()
    assert len(service.calls("Exec")) == 1
    assert backend.channel is not None and backend.channel.unary_exec is False
    await backend.destroy(spec.sandbox_id)


@pytest.mark.parametrize("exec_rpc", ["auto", "unary"])
async def test_a_first_burst_learns_a_served_exec_from_one_probe(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory, exec_rpc: str
) -> None:
    """A service that serves unary Exec: one Exec during the first burst (the others stream meanwhile), then
    unary for every exec."""
    backend = make_backend(exec_rpc=exec_rpc)
    spec = make_spec("served")
    await backend.create(spec)
    assert await _burst(backend, spec.sandbox_id) == _expected()
    service = cw_server.service
    assert len(service.calls("Exec")) == 1
    assert len(service.calls("StreamExec")) == BURST - 1
    assert backend.channel is not None and backend.channel.unary_exec is True
    assert await _burst(backend, spec.sandbox_id) == _expected()
    assert len(service.calls("Exec")) == 1 + BURST
    assert len(service.calls("StreamExec")) == BURST - 1
    await backend.destroy(spec.sandbox_id)


async def test_a_cancelled_probe_lets_the_next_exec_ask(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    """A probe cut short taught nothing: the next exec asks again (the channel does not stay on StreamExec)."""
    backend = make_backend()
    spec = make_spec("cancelled")
    await backend.create(spec)
    service = cw_server.service
    service.faults.stall["Exec"] = 30.0
    with anyio.move_on_after(1.0) as scope:
        await backend.exec(spec.sandbox_id, make_request("true"))
    assert scope.cancelled_caught
    del service.faults.stall["Exec"]
    r = await backend.exec(spec.sandbox_id, make_request("/bin/sh", "-c", "echo again"))
    assert (r.returncode, r.stdout) == (0, b"again\n")
    assert len(service.calls("Exec")) == 2
    assert service.calls("StreamExec") == []
    assert backend.channel is not None and backend.channel.unary_exec is True
    await backend.destroy(spec.sandbox_id)


@pytest.mark.parametrize("where", ["before-ready", "during-command", "with-stdin"])
async def test_a_stream_exec_cut_by_a_cancel_scope_ends_the_call(
    cw_sdk_server: CoreWeaveTestServer, make_sdk_backend: BackendFactory, where: str
) -> None:
    """A caller's cancel scope ends a ``StreamExec`` wherever it waits (before the ready frame, or for the exit
    of a running command, or in a bidirectional call with stdin): the scope catches its own cancellation (the
    code after it runs), and the backend's next exec runs."""
    backend = make_sdk_backend(exec_rpc="stream")
    spec = make_spec(f"cut-{where}")
    await backend.create(spec)
    service = cw_sdk_server.service
    if where == "before-ready":
        service.faults.stall["StreamExec"] = 30.0
    request = make_request("sleep", "30")
    if where == "with-stdin":  # the bidirectional call: stdin chunks, a close, then the half-close
        request = ExecRequest(**{**{f: getattr(request, f) for f in request.__slots__}, "stdin": b"x" * 100_000})
    for _ in range(3):
        with anyio.move_on_after(0.5) as scope:
            await backend.exec(spec.sandbox_id, request)
        assert scope.cancelled_caught
    service.faults.stall.clear()
    r = await backend.exec(spec.sandbox_id, make_request("/bin/sh", "-c", "echo after"))
    assert (r.returncode, r.stdout) == (0, b"after\n")
    await backend.destroy(spec.sandbox_id)
