"""Ids, tags and cleanup across backend instances (another process's leftovers), and sweep through purge."""

from __future__ import annotations

import pytest

from cwsandbox_async import SandboxStatus, SandboxValidationError
from cwsandbox_async.testing.contract import make_request, make_spec

from .conftest import BackendFactory
from .server import CoreWeaveTestServer


async def test_another_instance_finds_lists_and_destroys_by_library_id(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    mine, other = make_backend(), make_backend()
    spec = make_spec("shared", env={"A": "1"})
    await mine.create(spec)
    (info,) = await other.list(["shared"])
    assert (info.sandbox_id, info.tags, info.status, info.backend) == (
        spec.sandbox_id,
        ("shared",),
        "running",
        "coreweave",
    )
    assert info.session_id == "contract" and info.owner_alive is True
    assert await other.status(spec.sandbox_id) is SandboxStatus.RUNNING
    r = await other.exec(spec.sandbox_id, make_request("printenv", "A"))
    assert r.stdout == b"1\n"
    fresh = make_backend()  # knows nothing: finds the service id by the id tag
    await fresh.destroy(spec.sandbox_id)
    assert cw_server.service.live() == []
    assert await mine.status(spec.sandbox_id) is SandboxStatus.COMPLETED


async def test_sweep_purges_leftovers_in_one_call(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    crashed, janitor = make_backend(sweep_on_close=False), make_backend()
    specs = [make_spec("leftover") for _ in range(3)]
    for spec in specs:
        await crashed.create(spec)
    assert await crashed.sweep(["leftover"]) == []  # its own are kept without include_own
    assert await janitor.sweep(["leftover"], older_than_seconds=3600) == []  # too young
    swept = await janitor.sweep(["leftover"])
    assert sorted(swept) == sorted(s.sandbox_id for s in specs)
    assert len(cw_server.service.calls("PurgeSandboxes")) == 1
    assert len(cw_server.service.calls("DeleteSandbox")) == 0
    assert cw_server.service.live() == []
    with pytest.raises(SandboxValidationError):
        await janitor.sweep([])


async def test_sweep_keeps_own_and_deletes_the_rest_one_by_one(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    crashed, mine = make_backend(sweep_on_close=False), make_backend()
    theirs, own = make_spec("mixed"), make_spec("mixed")
    await crashed.create(theirs)
    await mine.create(own)
    assert await mine.sweep(["mixed"]) == [theirs.sandbox_id]
    assert [b.sandbox.spec.tags for b in cw_server.service.live()] != []
    assert {i.sandbox_id for i in await mine.list(["mixed"])} == {own.sandbox_id}
    await mine.destroy(own.sandbox_id)


async def test_session_sweep_is_one_purge(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    """``Session.sweep`` goes through ``Backend.sweep``: one ``PurgeSandboxes``, no delete one by one."""
    import cwsandbox_async as cwa

    crashed = make_backend(sweep_on_close=False)
    specs = [make_spec("session-leftover") for _ in range(3)]
    for spec in specs:
        await crashed.create(spec)
    async with cwa.Session(backend=make_backend(), handle_signals=False) as s:
        swept = await s.sweep(["session-leftover"])
    assert sorted(swept) == sorted(spec.sandbox_id for spec in specs)
    assert len(cw_server.service.calls("PurgeSandboxes")) == 1
    assert len(cw_server.service.calls("DeleteSandbox")) == 0
    assert cw_server.service.live() == []
