"""The tests' event loop does not close while grpc still holds one of its operations (tests/settling_loop.py).

Each test drives a loop by hand (no anyio runner): a real grpc.aio server and channel on 127.0.0.1,
a server-streaming call cancelled as the last thing the loop runs, then ``close``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
import settling_loop
from settling_loop import SettlingEventLoop, grpc_operations_held

METHOD = "/settling.Test/Ticks"


async def _ticks(request: bytes, context: Any) -> AsyncIterator[bytes]:
    while True:
        yield b"tick"
        await asyncio.sleep(0.01)


def _server() -> grpc.aio.Server:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "settling.Test", {"Ticks": grpc.unary_stream_rpc_method_handler(_ticks)}
    )
    server.add_generic_rpc_handlers((handler,))
    return server


async def _cancel_a_stream_last() -> None:
    """Read one message of a stream, then stop the server, cancel the call and close the channel:
    a test's usual end, with nothing run after it."""
    server = _server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_stream(METHOD)(b"")
    assert await call.read() == b"tick"
    await server.stop(grace=None)
    call.cancel()
    await channel.close(grace=None)


def test_a_usual_end_closes_and_leaves_grpc_holding_nothing_of_the_loop() -> None:
    """What the cancels leave is handed back while close waits (and the count sees no false
    holder: with one, close would raise after the guard)."""
    loop = SettlingEventLoop()
    loop.run_until_complete(_cancel_a_stream_last())
    loop.close()
    assert loop.is_closed()
    assert grpc_operations_held(loop) == 0


def test_a_server_left_running_makes_close_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A running server always holds an operation (its wait for the next call). A plain loop closes
    anyway, and the next loop that polls grpc when a call reaches that server gets grpc's
    ``RuntimeError: Event loop is closed`` (the failure CI saw). This loop refuses to close, says so
    past the guard instead of hanging, and stays open for the cleanup."""
    monkeypatch.setattr(settling_loop, "GRPC_SETTLE_GUARD_SECONDS", 0.2)
    loop = SettlingEventLoop()

    async def start() -> grpc.aio.Server:
        server = _server()
        server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server

    server = loop.run_until_complete(start())
    assert grpc_operations_held(loop) >= 1
    with pytest.raises(RuntimeError, match="grpc still holds"):
        loop.close()
    assert not loop.is_closed()
    loop.run_until_complete(server.stop(grace=None))
    loop.close()
    assert loop.is_closed()
    assert grpc_operations_held(loop) == 0
