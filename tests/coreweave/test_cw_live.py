"""The backend contract on the real CoreWeave Sandbox service. Opt-in, never run by default.

    CWSANDBOX_API_KEY=... CWSANDBOX_LIVE=1 pytest -m live_coreweave tests/coreweave/test_cw_live.py

Needs both: the key alone never creates sandboxes. Optional: CWSANDBOX_BASE_URL (default
the public service), CWSANDBOX_LIVE_IMAGE (default python:3.11; needs sh and coreutils).
Every sandbox is tagged ``contract-*`` and destroyed; the backend purges its own at close.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from cwsandbox_async.backends.coreweave import CoreWeaveBackend
from cwsandbox_async.testing.contract import BackendContract

LIVE = os.environ.get("CWSANDBOX_LIVE") in ("1", "true", "yes") and bool(os.environ.get("CWSANDBOX_API_KEY"))

pytestmark = [
    pytest.mark.live_coreweave,
    pytest.mark.skipif(not LIVE, reason="set CWSANDBOX_API_KEY and CWSANDBOX_LIVE=1 to run against the service"),
]


class TestLiveCoreWeaveContract(BackendContract):
    create_timeout = 300.0  # a cold image pull

    @pytest.fixture
    async def backend(self) -> AsyncIterator[CoreWeaveBackend]:
        b = CoreWeaveBackend(image=os.environ.get("CWSANDBOX_LIVE_IMAGE", "python:3.11"))
        yield b
        await b.aclose()
