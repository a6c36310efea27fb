"""The CoreWeave backend warns about a limit it cannot enforce only when the caller asked for that limit.

``Resources()`` carries defaults for every backend (``pids=256``, ``tmp_mib=256``); the service has no
such limits. A session that never chose them hears nothing; one that set another value hears once.
"""

from __future__ import annotations

import structlog

from cwsandbox_async import Resources
from cwsandbox_async.testing.contract import make_spec
from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

from .conftest import BackendFactory


async def warnings_for(make_backend: BackendFactory, resources: Resources | None) -> list[dict[str, object]]:
    backend = make_backend()
    with structlog.testing.capture_logs() as logs:
        for _ in range(2):
            spec = make_spec("limits") if resources is None else make_spec("limits", resources=resources)
            await backend.create(spec)
            await backend.destroy(spec.sandbox_id)
    return [e for e in logs if e["log_level"] == "warning"]


async def test_the_default_limits_are_not_warned_about(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    assert await warnings_for(make_backend, None) == []
    assert len(cw_server.service.calls("CreateSandbox")) == 2  # they were made, and nothing was said


async def test_a_limit_the_caller_set_is_warned_about_once_by_name(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    (warned,) = await warnings_for(make_backend, Resources(pids=64))
    assert "does not enforce" in str(warned["event"])
    assert warned["pids"] == 64 and "tmp_mib" not in warned  # only what was asked for
    (both,) = await warnings_for(make_backend, Resources(pids=64, tmp_mib=1024))
    assert (both["pids"], both["tmp_mib"]) == (64, 1024)
    assert await warnings_for(make_backend, Resources(pids=None, tmp_mib=None)) == []
