"""Ids, tags and cleanup across backend instances (another process's leftovers), and sweep through purge."""

from __future__ import annotations

import pytest

import cwsandbox_async as cwa
from cwsandbox_async import SandboxStatus, SandboxTerminatedError, SandboxValidationError
from cwsandbox_async.testing.contract import make_request, make_spec
from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

from .conftest import BackendFactory


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


async def test_set_lifetime_holds_only_the_bound_set_at_create(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    """The protocol has no call to change a lifetime: a bound the create-time TTL meets holds, a shorter one
    is refused with a clear error, nothing is sent."""
    backend = make_backend()
    spec = make_spec("ttl", max_lifetime_seconds=120)
    await backend.create(spec)
    sid = spec.sandbox_id
    before = len(cw_server.service.requests)
    await backend.set_lifetime(sid, None)
    await backend.set_lifetime(sid, 600)  # the 120 s lifetime ends it sooner: the bound holds
    with pytest.raises(SandboxValidationError, match="only when it creates") as info:
        await backend.set_lifetime(sid, 60)
    assert "max_lifetime_seconds" in str(info.value) and info.value.infrastructure is False
    assert len(cw_server.service.requests) == before
    await backend.destroy(sid)
    with pytest.raises(SandboxTerminatedError):
        await backend.set_lifetime(sid, 600)


async def test_a_pool_with_a_hold_timeout_sets_the_lifetime_at_create(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory
) -> None:
    async with (
        cwa.Session({"max_lifetime_seconds": 150}, backend=make_backend(), handle_signals=False) as s,
        cwa.SandboxPool(s, size=1, lifetime_margin_seconds=30) as pool,
        pool.lease(hold_timeout_seconds=120) as sb,
    ):
        assert (await sb.exec(["true"])).returncode == 0
    creates = cw_server.service.calls("CreateSandbox")
    assert creates and {c.sandbox.spec.max_lifetime_seconds for c in creates} == {150}
    assert cw_server.service.live() == []


async def test_scope_tags_mark_every_sandbox_and_scope_list_and_sweep(
    cw_server: CoreWeaveTestServer, make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a live run uses: one tag on everything it makes, hidden from its tags, implied in its list."""
    monkeypatch.setenv("CWSANDBOX_ASYNC_SCOPE_TAGS", "run-1, ci")
    scoped, plain = make_backend(), make_backend(scope_tags=())
    assert scoped.scope == ("run-1", "ci")
    mine, other = make_spec("job"), make_spec("job")
    await scoped.create(mine)
    await plain.create(other)
    (create, _) = cw_server.service.calls("CreateSandbox")
    assert {"job", "run-1", "ci"} <= set(create.sandbox.spec.tags)
    assert [(i.sandbox_id, i.tags) for i in await scoped.list(["job"])] == [(mine.sandbox_id, ("job",))]
    assert {i.sandbox_id for i in await plain.list(["job"])} == {mine.sandbox_id, other.sandbox_id}
    assert await plain.sweep(["run-1"], include_own=True) == [mine.sandbox_id]
    assert [b.sandbox.spec.tags[0] for b in cw_server.service.live()] == ["job"]
    await plain.destroy(other.sandbox_id)
    with pytest.raises(SandboxValidationError):
        make_backend(scope_tags=("bad tag",))


async def test_session_sweep_is_one_purge(cw_server: CoreWeaveTestServer, make_backend: BackendFactory) -> None:
    """``Session.sweep`` goes through ``Backend.sweep``: one ``PurgeSandboxes``, no delete one by one."""

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
