"""The backend contract and the reward example on the real CoreWeave Sandbox service. Opt-in, never by default.

    CWSANDBOX_API_KEY=... make test-live-coreweave     # optional: CWSANDBOX_BASE_URL, CWSANDBOX_LIVE_IMAGE

``make`` sets ``CWSANDBOX_LIVE=1``; both are needed (a key in the environment alone never
creates sandboxes). Every sandbox this module makes carries one run tag (``live-<random>``:
the backends' ``scope_tags``, the example's via ``$CWSANDBOX_ASYNC_SCOPE_TAGS``); when the
module ends, whatever still carries it is swept and the sweep is checked. The image
(default ``python:3.11``) needs ``sh`` and coreutils.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from cwsandbox_async.backends.coreweave import CoreWeaveBackend
from cwsandbox_async.testing.contract import BackendContract

LIVE = os.environ.get("CWSANDBOX_LIVE") in ("1", "true", "yes") and bool(os.environ.get("CWSANDBOX_API_KEY"))
RUN_TAG = f"live-{uuid.uuid4().hex[:10]}"
IMAGE = os.environ.get("CWSANDBOX_LIVE_IMAGE", "python:3.11")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coreweave_reward.py"

pytestmark = [
    pytest.mark.live_coreweave,
    pytest.mark.skipif(not LIVE, reason="set CWSANDBOX_API_KEY and CWSANDBOX_LIVE=1 to run against the service"),
]


async def _sweep_run() -> list[str]:
    backend = CoreWeaveBackend(image=IMAGE, sweep_on_close=False)
    try:
        swept = await backend.sweep([RUN_TAG], include_own=True)
        left = await backend.list([RUN_TAG])
    finally:
        await backend.aclose()
    assert left == [], f"sandboxes tagged {RUN_TAG} survived the sweep: {[i.sandbox_id for i in left]}"
    return swept


@pytest.fixture(scope="module", autouse=True)
def sweep_afterwards() -> Iterator[None]:
    """After the module: delete whatever this run left (the suite destroys its own; this catches the rest)."""
    yield
    swept = asyncio.run(_sweep_run())
    print(f"live run {RUN_TAG}: swept {len(swept)} leftover sandbox(es)")


class TestLiveCoreWeaveContract(BackendContract):
    create_timeout = 300.0  # a cold image pull

    @pytest.fixture
    async def backend(self) -> AsyncIterator[CoreWeaveBackend]:
        b = CoreWeaveBackend(image=IMAGE, scope_tags=(RUN_TAG,))
        yield b
        await b.aclose()


async def test_reward_example_runs_on_the_service() -> None:
    env = {**os.environ, "CWSANDBOX_ASYNC_SCOPE_TAGS": RUN_TAG}
    with anyio.fail_after(900):
        proc = await anyio.run_process([sys.executable, str(EXAMPLE)], env=env, check=False)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert "rewards: [1.0, 1.0, 0.0, 0.0, 0.0]" in out
    assert "left running: 0" in out
