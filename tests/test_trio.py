"""Under trio (``anyio.run(main, backend="trio")``) a session refuses, at open, a backend that runs only on
asyncio, with a typed error that says so (it used to fail later with ``RuntimeError: no running event
loop``, logged as a backend bug). Every backend the library ships needs asyncio but the fake: the local
one's channel is asyncio protocols and loop callbacks, Kubernetes is aiohttp, CoreWeave ``grpc.aio``.

trio is a dev dependency; without it the refusal is still checked where there is no asyncio loop at all.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import anyio
import pytest

from cwsandbox_async import SandboxValidationError, Session
from cwsandbox_async._session import SessionState
from cwsandbox_async.testing import FakeBackend


class PortableFake(FakeBackend):
    """The fake, declaring what it is: it uses anyio only, so any loop anyio runs on will do."""

    asyncio_only = False


def run_without_a_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    """Step a coroutine that does not suspend, in this thread, where no event loop runs."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("the coroutine suspended")


@pytest.mark.parametrize("backend", ["local", "kubernetes", "coreweave"])
def test_a_backend_that_needs_asyncio_is_refused_at_open_without_it(backend: str) -> None:
    if backend == "coreweave":
        pytest.importorskip("grpc", reason="the coreweave extra is not installed")
    options = {"image": "python:3.11", "server": "http://127.0.0.1:9"} if backend == "kubernetes" else {}
    session = Session(backend=backend, backend_options=options)
    with pytest.raises(SandboxValidationError, match=f"the {backend} backend runs only on asyncio") as refused:
        run_without_a_loop(session.open())
    assert "asyncio.run" in str(refused.value) and refused.value.infrastructure is False
    assert session.state is SessionState.NEW  # nothing was opened, so nothing to close


def test_under_trio_the_local_backend_is_refused_at_open() -> None:
    pytest.importorskip("trio")

    async def main() -> None:
        async with Session(backend="local"):
            pytest.fail("opened")

    with pytest.raises(SandboxValidationError, match="runs only on asyncio's event loop"):
        anyio.run(main, backend="trio")


def test_under_trio_a_backend_that_does_not_need_asyncio_works() -> None:
    pytest.importorskip("trio", minversion="0.32")  # anyio's trio backend needs it

    async def main() -> str:
        async with Session(backend=PortableFake(seed=5)) as s, s.sandbox() as sb:
            return (await sb.exec(["echo", "on trio"])).stdout

    assert anyio.run(main, backend="trio") == "on trio\n"
