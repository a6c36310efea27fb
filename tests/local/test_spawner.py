"""The native spawner (``agent/spawn.c``) against the pure-Python path (a fork of PID 1 per command).

Each behaviour test runs on both paths (``path``: the native one, and ``CWSANDBOX_LOCAL_SPAWNER=python``)
and checks that the sandbox says which one it used; the fallbacks (no compiler, a spawner that does
not run in the sandbox) are checked to run the Python path and to say so once at WARNING. The
protection suites (hardening, isolation, limits, verdicts, adversarial) run on the default path; run
them with ``CWSANDBOX_LOCAL_SPAWNER=python`` for the other.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from typing import Any

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend, _native

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation

HAS_CC = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))


@pytest.fixture(params=["native", "python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native":
        if not HAS_CC:
            pytest.skip("no C compiler (cc, gcc or clang) on PATH: no spawner to build; the fallback tests still run")
        monkeypatch.delenv(_native.ENV, raising=False)
    else:
        monkeypatch.setenv(_native.ENV, "python")
    return str(request.param)


def hello(session: cwa.Session, sb: cwa.Sandbox) -> dict[str, Any]:
    box = session.backend._boxes[sb.sandbox_id]  # type: ignore[attr-defined]
    return dict(box.runner.channel.hello or {})


async def test_commands_start_the_same_on_both_paths(tag: str, path: str) -> None:
    async with local_session(tag, isolation="unshare", resources=cwa.Resources(cpu_seconds=7)) as s:
        sb = await s.sandbox()
        assert hello(s, sb)["spawner"] is (path == "native")
        r = await sb.exec(["nope-not-here"])
        assert (r.returncode, r.stderr) == (127, "cwsandbox: nope-not-here: command not found\n")
        r = await sb.exec(["/etc/passwd"])
        assert (r.returncode, r.stderr) == (126, "cwsandbox: /etc/passwd: permission denied\n")
        r = await sb.exec(["true"], cwd="/no/such/dir")
        assert r.returncode == 126
        assert r.stderr == "cwsandbox: cannot change directory to '/no/such/dir': No such file or directory\n"
        # only 0, 1 and 2 (and ls's own listing) are open; its own session; the rlimits; the commands' cgroup
        script = (
            "ls /proc/self/fd | tr '\\n' ' '; echo; cut -d' ' -f6 /proc/$$/stat; echo $$; "
            "ulimit -St; ulimit -Ht; cat /proc/self/cgroup"
        )
        r = await sb.exec(["sh", "-c", script], env={"A": "1"})
        fds, sid, pid, soft, hard, *groups = r.stdout.splitlines()
        assert fds.split() == ["0", "1", "2", "3"], r
        assert sid.strip() == pid
        assert (soft, hard) == ("7", "8")
        if s.backend._machine.cgroups.available:  # type: ignore[attr-defined]
            assert any(line.endswith("/cmd") for line in groups), groups
        r = await sb.exec(["sh", "-c", "echo $A-$B; cat"], env={"A": "x", "B": "y"}, stdin=b"in\n")
        assert r.stdout == "x-y\nin\n"
        # a daemon the command leaves behind stays in its tree and dies with the exec (the subreaper)
        r = await sb.exec(["sh", "-c", "(setsid sleep 30 &) ; echo started"])
        assert r.stdout == "started\n"
        left = await sb.exec(["sh", "-c", "cat /proc/[0-9]*/comm | grep -c '^sleep$' || true"])
        assert left.stdout.strip() == "0"


async def test_the_sandbox_can_run_the_spawner_but_not_read_or_change_it(tag: str, path: str) -> None:
    """Execute-only, so the kernel makes it non-dumpable (its memory holds a request while it runs)."""
    async with local_session(tag, isolation="unshare") as s:
        sb = await s.sandbox()
        spawner = _native.INSIDE
        script = f"test -e {spawner} && echo here; test -x {spawner} && echo x; head -c1 {spawner}"
        r = await sb.exec(["sh", "-c", script])
        if path == "python":
            assert r.stdout == "", r  # not bound at all
            return
        assert r.stdout == "here\nx\n" and "Permission denied" in r.stderr, r
        r = await sb.exec(["sh", "-c", f"echo > {spawner}"])
        assert r.returncode != 0, r


async def test_a_spawner_that_cannot_run_falls_back_with_one_warning(
    tag: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(_native.ENV, raising=False)
    monkeypatch.setattr(_native, "spawner", lambda: "/nonexistent/cwspawn")  # not bound: it cannot run inside
    monkeypatch.setattr(_native, "_warned", False)
    caplog.set_level(logging.WARNING, logger="cwsandbox_async")
    async with local_session(tag, isolation="unshare") as s:
        sb = await s.sandbox()
        assert hello(s, sb)["spawner"] is False
        assert (await sb.exec(["echo", "ok"])).stdout == "ok\n"
        await s.sandbox()
    warned = [r for r in caplog.records if "native spawner is not available" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


def test_no_compiler_means_the_python_path_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    monkeypatch.delenv(_native.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there yet
    monkeypatch.setattr(_native, "_built", {})
    monkeypatch.setattr(_native, "_warned", False)
    monkeypatch.setattr(_native.shutil, "which", lambda name: None)
    caplog.set_level(logging.WARNING, logger="cwsandbox_async")
    assert _native.spawner() is None
    assert _native.spawner() is None
    warned = [r for r in caplog.records if "native spawner is not available" in r.getMessage()]
    assert len(warned) == 1 and "no C compiler" in warned[0].getMessage()


@pytest.mark.skipif(not HAS_CC, reason="no C compiler (cc, gcc or clang) on PATH: nothing to compare the fallback with")
def test_the_spawner_is_built_once_execute_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv(_native.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(_native, "_built", {})
    built = _native.spawner()
    assert built is not None and built.startswith(str(tmp_path))
    assert stat.S_IMODE(os.stat(built).st_mode) == 0o111
    monkeypatch.setattr(_native, "_built", {})
    assert _native.spawner() == built  # found again, not rebuilt
    monkeypatch.setenv(_native.ENV, "python")
    assert _native.spawner() is None


async def test_a_spawner_gone_at_an_exec_falls_back_to_the_fork_without_leaking_fds(
    tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PID 1 told to use a spawner that is not there (an unisolated agent, given a bogus path): the
    command still runs, through the fork, and gets no descriptor more than without a spawner."""
    from cwsandbox_async.backends.local._runners.base import Machine

    plain = Machine.agent_config
    script = "ls /proc/self/fd | tr '\\n' ' '"

    def with_bogus_spawner(self: Machine, spec: Any, rlimits: dict[str, int]) -> dict[str, Any]:
        return {**plain(self, spec, rlimits), "spawner": "/nonexistent/cwspawn"}

    async def fds_seen() -> list[list[str]]:
        with pytest.warns(RuntimeWarning, match="NOT isolated"):
            backend = LocalBackend(isolation="none")
        async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend=backend) as s:
            sb = await s.sandbox()
            out = []
            for _ in range(2):  # the first gives the spawner up, the second forks straight away
                r = await sb.exec(["sh", "-c", script], stdin=b"x")
                assert r.returncode == 0, r
                out.append(r.stdout.split())
            return out

    without = await fds_seen()
    monkeypatch.setattr(Machine, "agent_config", with_bogus_spawner)
    assert [len(x) for x in await fds_seen()] == [len(x) for x in without]
