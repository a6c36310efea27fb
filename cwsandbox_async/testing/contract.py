"""The backend contract suite: behaviour every backend must show, written once.

Subclass ``BackendContract`` in a test module and provide a ``backend`` fixture
that yields a ready ``Backend`` (and closes it afterwards)::

    from cwsandbox_async.testing.contract import BackendContract

    class TestMyBackend(BackendContract):
        @pytest.fixture
        async def backend(self):
            b = MyBackend()
            yield b
            await b.aclose()

The tests run with the anyio pytest plugin (``anyio_mode = "auto"`` or the
``anyio`` marker). Each test destroys what it creates, and the last check of every
test is that the backend lists no sandbox of the test's own tag.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from .._budget import CloseBudget
from .._errors import (
    SandboxError,
    SandboxFileError,
    SandboxNotFoundError,
    SandboxNotRunningError,
    SandboxNotSupportedError,
    SandboxTimeoutError,
    SandboxValidationError,
)
from .._sandbox import Sandbox
from .._settings import Timeouts
from .._types import ExecExit, ExecRequest, SandboxDefaults, SandboxSpec, SandboxStatus, StreamName
from ..backends.base import Backend
from ..metrics._aggregator import MetricsAggregator

__all__ = ["BackendContract", "make_request", "make_spec"]


def make_spec(*tags: str, **overrides: object) -> SandboxSpec:
    """A spec with a fresh id, the given tags and default limits."""
    defaults = SandboxDefaults(tags=tags).with_overrides(**overrides) if overrides else SandboxDefaults(tags=tags)
    return SandboxSpec(sandbox_id=f"sbx-{uuid.uuid4().hex[:12]}", session_id="contract", defaults=defaults)


def make_request(
    *argv: str,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: str = "/workspace",
    timeout: float = 30.0,
    max_output: int = 1 << 20,
) -> ExecRequest:
    """An ``ExecRequest`` for a backend's ``exec``: ``argv`` as given, run in ``cwd`` with ``env``
    (nothing inherited), ``timeout`` seconds and ``max_output`` bytes per stream."""
    return ExecRequest(
        argv=argv, cwd=cwd, env=env or {}, stdin=stdin, timeout_seconds=timeout, max_output_bytes=max_output
    )


class BackendContract:
    """Tests every backend passes. Provide a ``backend`` fixture in the subclass."""

    #: Seconds a create may take on this backend (raise it for slow backends).
    create_timeout: float = 60.0
    #: Seconds any other call (destroy, list, status, a file transfer, a short exec) may take.
    call_timeout: float = 30.0
    #: Seconds past an exec's own timeout before the suite calls the backend stuck.
    exec_grace: float = 15.0

    #: Whether its sandboxes have ``bash`` (``Sandbox.shell`` runs it); the fake's built-in shell does not.
    has_bash: bool = True
    #: Whether its sandboxes can be attached to (``Backend.attach``); False: ``attach`` raises
    #: ``SandboxNotSupportedError`` for them.
    attachable: bool = True

    @pytest.fixture
    def peer(self) -> Backend | None:
        """A second backend of the same kind that sees the sandboxes of ``backend`` as another process of the
        same user would (for ``attach``). None (this default): the attach tests are skipped. Override it."""
        return None

    @pytest.fixture
    def tag(self) -> str:
        return f"contract-{uuid.uuid4().hex[:8]}"

    @asynccontextmanager
    async def sandbox(self, backend: Backend, tag: str, **overrides: object) -> AsyncIterator[str]:
        spec = make_spec(tag, **overrides)
        try:
            with anyio.fail_after(self.create_timeout):
                await backend.create(spec)
            yield spec.sandbox_id
        finally:
            with anyio.CancelScope(shield=True), anyio.fail_after(self.call_timeout):
                await backend.destroy(spec.sandbox_id)

    async def run(self, backend: Backend, sid: str, *argv: str, **kw: object) -> ExecExit:
        req = make_request(*argv, **kw)  # type: ignore[arg-type]
        with anyio.fail_after(req.timeout_seconds + self.exec_grace):
            return await backend.exec(sid, req)

    async def assert_none_left(self, backend: Backend, tag: str) -> None:
        with anyio.fail_after(self.call_timeout):
            left = await backend.list([tag])
        assert [i.sandbox_id for i in left] == []

    # -- lifecycle -------------------------------------------------------------
    async def test_create_status_destroy(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            assert await backend.status(sid) is SandboxStatus.RUNNING
            listed = await backend.list([tag])
            assert [i.sandbox_id for i in listed] == [sid]
            assert listed[0].tags == (tag,)
        assert (await backend.status(sid)).is_terminal
        await backend.destroy(sid)  # idempotent
        await self.assert_none_left(backend, tag)

    async def test_sweep_spares_its_own_unless_asked(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            assert backend.owns(sid)
            with anyio.fail_after(self.call_timeout):
                assert await backend.sweep([tag]) == []
                assert await backend.sweep([tag], older_than_seconds=3600, include_own=True) == []  # too young
                assert await backend.sweep([tag], include_own=True) == [sid]
            assert not backend.owns(sid)
            with pytest.raises(SandboxValidationError):
                await backend.sweep([])  # neither tags nor an age: it would stop everything
        await self.assert_none_left(backend, tag)

    async def test_destroy_unknown_id_is_not_an_error(self, backend: Backend) -> None:
        await backend.destroy(f"sbx-{uuid.uuid4().hex[:12]}")

    async def test_list_filters_by_all_tags(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as a, self.sandbox(backend, tag, tags=("other",)) as b:
            assert {i.sandbox_id for i in await backend.list([tag])} == {a, b}
            assert {i.sandbox_id for i in await backend.list([tag, "other"])} == {b}
            assert await backend.list([tag, "absent"]) == []
        await self.assert_none_left(backend, tag)

    # -- exec ------------------------------------------------------------------
    async def test_exec_stdout_and_exit_code(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            ok = await self.run(backend, sid, "echo", "hello")
            assert (ok.returncode, ok.stdout, ok.timed_out, ok.truncated) == (0, b"hello\n", False, False)
            bad = await self.run(backend, sid, "/bin/sh", "-c", "exit 3")
            assert bad.returncode == 3

    async def test_exec_stderr(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            r = await self.run(backend, sid, "/bin/sh", "-c", "echo oops >&2")
            assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"oops\n")

    async def test_exec_stdin_env_cwd(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            r = await self.run(backend, sid, "cat", stdin=b"\x00\xffdata")
            assert r.stdout == b"\x00\xffdata"
            r = await self.run(backend, sid, "printenv", "CONTRACT_VAR", env={"CONTRACT_VAR": "v1"})
            assert r.stdout == b"v1\n"
            r = await self.run(backend, sid, "pwd", cwd="/tmp")
            assert r.stdout == b"/tmp\n"

    async def test_missing_executable_is_127(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            r = await self.run(backend, sid, "/no/such/binary")
            assert r.returncode == 127

    async def test_exec_timeout_kills_and_reports(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            start = time.monotonic()
            r = await self.run(backend, sid, "sleep", "60", timeout=1.0)
            assert r.timed_out
            assert time.monotonic() - start < 10
            again = await self.run(backend, sid, "echo", "alive")
            assert again.stdout == b"alive\n"

    async def test_output_cap_truncates(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            r = await self.run(backend, sid, "yes", max_output=4096, timeout=20)
            assert r.truncated
            assert not r.timed_out
            assert 0 < len(r.stdout) <= 4096

    async def test_streaming_chunks_match_result(self, backend: Backend, tag: str) -> None:
        chunks: dict[StreamName, list[bytes]] = {"stdout": [], "stderr": []}

        async def on_output(stream: StreamName, data: bytes) -> None:
            chunks[stream].append(data)

        async with self.sandbox(backend, tag) as sid:
            req = make_request("/bin/sh", "-c", "echo one; echo two >&2; echo three")
            with anyio.fail_after(self.call_timeout):
                r = await backend.exec(sid, req, on_output)
            assert b"".join(chunks["stdout"]) == r.stdout == b"one\nthree\n"
            assert b"".join(chunks["stderr"]) == r.stderr == b"two\n"

    async def test_concurrent_execs(self, backend: Backend, tag: str) -> None:
        results: dict[int, bytes] = {}
        async with self.sandbox(backend, tag) as sid:

            async def one(i: int) -> None:
                results[i] = (await self.run(backend, sid, "echo", str(i))).stdout

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
        assert results == {i: f"{i}\n".encode() for i in range(8)}

    async def test_cancelled_exec_leaves_sandbox_usable(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            with anyio.move_on_after(0.5) as scope:
                await backend.exec(sid, make_request("sleep", "60"))
            assert scope.cancelled_caught
            r = await self.run(backend, sid, "echo", "still")
            assert r.stdout == b"still\n"

    async def test_exec_after_destroy_raises(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            pass
        with pytest.raises(SandboxNotRunningError):
            await self.run(backend, sid, "true")

    # -- files -----------------------------------------------------------------
    async def test_file_round_trip(self, backend: Backend, tag: str) -> None:
        data = bytes(range(256)) * 64
        async with self.sandbox(backend, tag) as sid:
            await backend.write_file(sid, "/workspace/sub/dir/blob.bin", data)
            assert await backend.read_file(sid, "/workspace/sub/dir/blob.bin", 1 << 20) == data
            await backend.write_file(sid, "/workspace/sub/dir/blob.bin", b"short")
            assert await backend.read_file(sid, "/workspace/sub/dir/blob.bin", 1 << 20) == b"short"
            r = await self.run(backend, sid, "cat", "/workspace/sub/dir/blob.bin")
            assert r.stdout == b"short"
            await backend.write_file(sid, "/tmp/empty", b"")
            assert await backend.read_file(sid, "/tmp/empty", 10) == b""

    async def test_file_errors_are_typed(self, backend: Backend, tag: str) -> None:
        async with self.sandbox(backend, tag) as sid:
            with pytest.raises(SandboxFileError):
                await backend.read_file(sid, "/workspace/missing.txt", 1024)
            await backend.write_file(sid, "/workspace/big.txt", b"x" * 2048)
            with pytest.raises(SandboxFileError):
                await backend.read_file(sid, "/workspace/big.txt", 1024)
            with pytest.raises(SandboxError):
                await backend.read_file(sid, "/workspace", 1024)

    # -- attach ------------------------------------------------------------------
    async def test_attach_reaches_another_backends_sandbox_and_its_close_lets_go(
        self, backend: Backend, peer: Backend | None, tag: str
    ) -> None:
        if peer is None:
            pytest.skip("no peer backend given (the ``peer`` fixture)")
        async with self.sandbox(backend, tag, env={"FROM_CREATOR": "yes"}) as sid:
            if not self.attachable:
                with pytest.raises(SandboxNotSupportedError), anyio.fail_after(self.call_timeout):
                    await peer.attach(sid, SandboxDefaults(), session_id="peer")
                return
            with anyio.fail_after(self.call_timeout):
                got = await peer.attach(sid, SandboxDefaults(), session_id="peer")
            assert tag in got.tags and got.env.get("FROM_CREATOR") == "yes"
            with anyio.fail_after(self.call_timeout):
                await peer.write_file(sid, "/workspace/from-peer.txt", b"peer")
                assert await backend.read_file(sid, "/workspace/from-peer.txt", 1024) == b"peer"
            ex = await self.run(peer, sid, "echo", "attached")
            assert (ex.returncode, ex.stdout) == (0, b"attached\n")
            assert not peer.owns(sid)
            with anyio.fail_after(self.call_timeout):
                await peer.aclose()  # not adopted: it lets go, the sandbox runs on
            assert (await self.run(backend, sid, "true")).returncode == 0
        await self.assert_none_left(backend, tag)

    async def test_attach_adopted_is_owned_and_stopped_by_the_adopter(
        self, backend: Backend, peer: Backend | None, tag: str
    ) -> None:
        if peer is None or not self.attachable:
            pytest.skip("this backend cannot attach (checked by the test above)")
        async with self.sandbox(backend, tag) as sid:
            with anyio.fail_after(self.call_timeout):
                await peer.attach(sid, SandboxDefaults(), session_id="peer", adopt=True)
            assert peer.owns(sid)
            with anyio.fail_after(self.call_timeout):
                await backend.destroy(sid)  # its creator's stop: it no longer owns it
            assert (await self.run(peer, sid, "true")).returncode == 0
            with anyio.fail_after(self.call_timeout):
                await peer.destroy(sid)
                assert (await backend.status(sid)).is_terminal
        await self.assert_none_left(backend, tag)

    async def test_attach_to_an_unknown_or_stopped_id_is_not_found(
        self, backend: Backend, peer: Backend | None, tag: str
    ) -> None:
        if peer is None or not self.attachable:
            pytest.skip("this backend cannot attach (checked above)")
        with pytest.raises(SandboxNotFoundError), anyio.fail_after(self.call_timeout):
            await peer.attach("sbx-000000000000", SandboxDefaults(), session_id="peer")
        async with self.sandbox(backend, tag) as sid:
            pass
        with pytest.raises(SandboxNotFoundError), anyio.fail_after(self.call_timeout):
            await peer.attach(sid, SandboxDefaults(), session_id="peer")

    # -- the persistent shell ------------------------------------------------------
    async def test_shell_carries_state_and_reports_each_runs_true_status(self, backend: Backend, tag: str) -> None:
        if not self.has_bash:
            pytest.skip("no bash in this backend's sandboxes")
        async with self.sandbox(backend, tag) as sid:
            sb = Sandbox(
                sandbox_id=sid,
                backend=backend,
                defaults=SandboxDefaults(tags=(tag,)),
                metrics=MetricsAggregator(),
                timeouts=Timeouts(),
                budget=CloseBudget(),
            )
            with anyio.fail_after(self.call_timeout * 4):
                async with sb.shell() as sh:
                    assert (await sh.run("mkdir -p d && cd d && export A=1 && f() { echo fn; }")).returncode == 0
                    r = await sh.run("echo 'exit status: 0'; echo $PWD $A; f; exit 3")
                    assert (r.returncode, r.stdout) == (3, "exit status: 0\n/workspace/d 1\nfn\n")
                    with pytest.raises(SandboxTimeoutError):
                        await sh.run("cd /; sleep 3600", timeout_seconds=1.0)
                    assert (await sh.run("pwd")).stdout == "/workspace/d\n"
        await self.assert_none_left(backend, tag)
