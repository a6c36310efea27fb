"""Leftovers are found by label and removed: crashed drivers, close-time sweeps, creates that raced a destroy."""

from __future__ import annotations

import os

import anyio
import pytest

import cwsandbox_async as cwa
from cwsandbox_async import SandboxValidationError
from cwsandbox_async.testing.contract import make_spec

from .conftest import BackendFactory, needs_bwrap, wait_for, wait_no_pods
from .server import KubeTestServer

pytestmark = needs_bwrap


async def crashed_driver(make_backend: BackendFactory, *tag_sets: tuple[str, ...]) -> list[str]:
    """Pods of a driver that died without cleaning up (no destroy, no close-time sweep)."""
    dead = make_backend(sweep_on_close=False)
    ids = []
    for tags in tag_sets:
        spec = make_spec(*tags)
        await dead.create(spec)
        ids.append(spec.sandbox_id)
    await dead.aclose()
    return ids


async def test_sweep_removes_a_crashed_drivers_pods(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    left = await crashed_driver(make_backend, ("job-7",), ("job-7", "gpu"), ("job-7",), ("other",))
    assert k8s_server.live_pods() == sorted(left)
    survivor = make_backend()
    found = await survivor.list(["job-7"])
    assert {i.sandbox_id for i in found} == set(left[:3])
    assert all(i.owner_pid == os.getpid() and i.owner_alive and i.backend == "kubernetes" for i in found)
    before = len(k8s_server.requests)
    swept = await survivor.sweep(["job-7"])
    assert sorted(swept) == sorted(left[:3])
    (call,) = k8s_server.requests[before:]  # one deletecollection call, by label
    assert call.method == "DELETE" and call.path.endswith("/pods")
    assert "tag.cwsandbox.io/" in (call.param("labelSelector") or "")
    await wait_for(lambda: k8s_server.live_pods() == [left[3]])
    assert await survivor.sweep(["other"], older_than_seconds=0.01) == [left[3]]
    await wait_no_pods(k8s_server)


async def test_session_sweep_spares_its_own_sandboxes(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    left = await crashed_driver(make_backend, ("rollout",), ("rollout",))
    async with cwa.Session({"tags": ("rollout",)}, backend=make_backend(), handle_signals=False) as s:
        mine = await s.sandbox()
        assert sorted(await s.sweep()) == sorted(left)
        await wait_for(lambda: k8s_server.live_pods() == [mine.sandbox_id])
        assert (await mine.exec(["true"])).returncode == 0
    await wait_no_pods(k8s_server)


async def test_session_sweep_is_one_deletecollection(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    """``Session.sweep`` goes through ``Backend.sweep``: one DELETE of the pod collection, none of a single pod."""
    left = await crashed_driver(make_backend, ("gone",), ("gone",), ("gone",))
    async with cwa.Session(backend=make_backend(), handle_signals=False) as s:
        before = len(k8s_server.requests)
        assert sorted(await s.sweep(["gone"])) == sorted(left)
        deletes = [c for c in k8s_server.requests[before:] if c.method == "DELETE"]
    assert [c.path.rsplit("/", 1)[-1] for c in deletes] == ["pods"]
    await wait_no_pods(k8s_server)


async def test_backend_sweep_spares_its_own_pods_unless_asked(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend()
    spec = make_spec("mine")
    await backend.create(spec)
    assert await backend.sweep(["mine"]) == []
    assert await backend.sweep(["mine"], include_own=True) == [spec.sandbox_id]
    with pytest.raises(SandboxValidationError):
        await backend.sweep([])
    await wait_no_pods(k8s_server)


async def test_close_deletes_whatever_the_backend_still_owns(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend()
    for _ in range(3):
        await backend.create(make_spec("forgotten"))
    await backend.aclose()
    await wait_no_pods(k8s_server)


async def test_a_create_that_lands_after_its_destroy_is_reaped(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    backend = make_backend()
    await backend.create(make_spec("warm"))  # starts the shared watch
    k8s_server.add_fault("delay", method="POST", seconds=0.5)
    k8s_server.watch_lag = 0.1  # the pod's start events reach the watch after the reaping DELETE returned
    spec = make_spec("late")
    with anyio.move_on_after(0.2):
        await backend.create(spec)  # cancelled while the POST is still in flight
    await backend.destroy(spec.sandbox_id)  # 404: the pod does not exist yet
    assert spec.sandbox_id not in k8s_server.live_pods()
    # the POST lands, and the watch reaps the pod
    await wait_for(lambda: k8s_server.events(spec.sandbox_id)[-1:] == ["DELETED"])
    # every event has reached the backend's watch (they come in order; DELETED is the last)
    await wait_for(lambda: backend.watch is not None and backend.watch.seen_deleted(spec.sandbox_id))
    assert k8s_server.events(spec.sandbox_id)[0] == "ADDED"
    # the destroy's DELETE (404) and ONE reaping DELETE, however many events the pod's start sent before
    # the reap took effect (under load they arrive after it: that once made a third DELETE)
    deletes = k8s_server.calls("DELETE", spec.sandbox_id)
    assert len(deletes) == 2


async def test_an_event_while_the_destroys_delete_is_in_flight_adds_no_delete(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    """A watch event sent before the destroy's own DELETE took effect, arriving while that DELETE is
    in flight, is not a create that raced its destroy: no second, "reaping" DELETE (a 500-pod pool on
    the real apiserver made 1.18 DELETEs per pod this way, each extra one a 404)."""
    backend = make_backend()
    spec = make_spec("busy")
    sid = spec.sandbox_id
    await backend.create(spec)
    gate = anyio.Event()
    k8s_server.add_fault("delay", method="DELETE", path=f"/{sid}$", gate=gate)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(backend.destroy, sid)
            await wait_for(lambda: len(k8s_server.calls("DELETE", sid)) == 1)  # held in flight
            rt = next(r for (ns, name), r in k8s_server.pods.items() if name == sid)
            k8s_server._bump(rt)  # a status change the watch delivers while the DELETE is held
            rv = rt.obj["metadata"]["resourceVersion"]
            watch = backend.watch
            assert watch is not None
            await wait_for(lambda: (watch.pods.get(sid) or {}).get("metadata", {}).get("resourceVersion") == rv)
            # the backend has seen the event: a reap, had it decided on one, is already under way
            assert backend._cleanup is not None and backend._cleanup.pending(f"reap:{sid}") == 0
            gate.set()
        await wait_for(lambda: k8s_server.events(sid)[-1:] == ["DELETED"])
    finally:
        gate.set()
        await backend.aclose()
    assert len(k8s_server.calls("DELETE", sid)) == 1


async def test_list_follows_continue_tokens(
    k8s_server: KubeTestServer, make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cwsandbox_async.backends.kubernetes import _inventory

    monkeypatch.setattr(_inventory, "LIST_LIMIT", 2)
    backend = make_backend()
    ids = set()
    for _ in range(5):
        spec = make_spec("paged")
        await backend.create(spec)
        ids.add(spec.sandbox_id)
    before = len(k8s_server.calls("GET", r"/pods$", watch=False))
    assert {i.sandbox_id for i in await backend.list(["paged"])} == ids
    pages = k8s_server.calls("GET", r"/pods$", watch=False)[before:]
    assert [p.param("limit") for p in pages] == ["2", "2", "2"]
    assert [bool(p.param("continue")) for p in pages] == [False, True, True]
    await backend.aclose()
    await wait_no_pods(k8s_server)
