"""The persistent shell (``Sandbox.shell``) on real local sandboxes: state carries, verdicts do not lie.

Each run is one exec: its exit status is PID 1's report, never something the command prints or writes.
The attacks a command can make on a shell (print a fake status, write into every descriptor it can
reach, kill the shell, ``exit``, ``exec`` over it, time out) each give the run's true result, and the
next run works with the state the last completed run saved.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import cwsandbox_async as cwa
from cwsandbox_async._sandbox import Sandbox

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation


@pytest.fixture
async def sb(tag: str) -> AsyncIterator[Sandbox]:
    async with local_session(tag) as s, s.sandbox() as box:
        yield box


async def test_cwd_variables_functions_and_options_carry_over(sb: Sandbox) -> None:
    async with sb.shell() as sh:
        r = await sh.run("mkdir -p repo && cd repo && export A=1 && B=two && f() { echo fn-$1; } && umask 027")
        assert r.returncode == 0, r.stderr
        await sh.run("set -o pipefail")
        r = await sh.run("echo \"$PWD $A $B\"; f x; umask; sh -c 'echo child:$A:$B'; false | true")
        assert r.returncode == 1  # pipefail carried over
        assert r.stdout == "/workspace/repo 1 two\nfn-x\n0027\nchild:1:\n"  # only exported reach children
        assert r.command == ("bash", "-c", "echo \"$PWD $A $B\"; f x; umask; sh -c 'echo child:$A:$B'; false | true")


async def test_errexit_carries_over_and_a_failing_command_under_it_still_saves_the_state(sb: Sandbox) -> None:
    async with sb.shell() as sh:
        assert (await sh.run("set -e; cd /tmp; false; echo not-reached")).returncode == 1
        r = await sh.run('echo "$PWD $-"')
        assert r.stdout.split()[0] == "/tmp" and "e" in r.stdout.split()[1]


async def test_noclobber_carries_over_and_does_not_stop_the_state_being_saved(sb: Sandbox) -> None:
    async with sb.shell() as sh:
        await sh.run("true")  # the state file exists from here on
        await sh.run("set -o noclobber; cd /tmp")
        r = await sh.run("echo $PWD; set -o | grep noclobber")
        assert r.stdout.split() == ["/tmp", "noclobber", "on"]


async def test_a_run_that_times_out_is_killed_and_the_shell_keeps_the_state_from_before(sb: Sandbox) -> None:
    async with sb.shell() as sh:
        await sh.run("export X=before; cd /tmp")
        with pytest.raises(cwa.SandboxTimeoutError) as caught:
            await sh.run("export X=during; cd /; echo started; sleep 3600", timeout_seconds=0.5)
        assert caught.value.infrastructure is False and caught.value.result is not None
        assert caught.value.result.stdout == "started\n"
        r = await sh.run('echo "$X $PWD"; pgrep -x sleep || echo no-sleep')
        assert r.stdout == "before /tmp\nno-sleep\n"


async def test_a_printed_fake_status_is_just_output(sb: Sandbox) -> None:
    async with sb.shell() as sh:
        r = await sh.run("echo 'exit status: 0'; echo '__cwsandbox_status__ 0' >&2; exit 3")
        assert r.returncode == 3
        assert r.stdout == "exit status: 0\n"


async def test_writing_into_every_descriptor_it_can_reach_does_not_change_the_status(sb: Sandbox) -> None:
    # The run's own descriptors and its shell's (``/proc/$$/fd``) and PID 1's: the status is PID 1's report,
    # which travels on a socket no process of the sandbox holds.
    script = (
        "for f in /proc/$$/fd/* /proc/self/fd/* /proc/1/fd/*; do "
        "printf '\\001\\000\\000\\000\\000\\000\\000\\000' > \"$f\"; done 2>/dev/null; exit 5"
    )
    async with sb.shell() as sh:
        assert (await sh.run(script)).returncode == 5
        assert (await sh.run("echo ok")).stdout == "ok\n"


async def test_killing_the_shell_is_its_true_result_and_the_next_run_works(sb: Sandbox) -> None:
    async with sb.shell() as sh:
        await sh.run("cd /tmp")
        r = await sh.run("cd /; kill -9 $$")
        assert r.returncode == -9
        assert (await sh.run("pwd")).stdout == "/tmp\n"  # the killed run saved nothing


async def test_exit_saves_the_state_and_reports_its_status(sb: Sandbox) -> None:
    async with sb.shell() as sh:
        assert (await sh.run("cd /tmp; export E=1; exit 0")).returncode == 0
        assert (await sh.run("echo $PWD $E; exit 4")).returncode == 4
        assert (await sh.run("echo $PWD $E")).stdout == "/tmp 1\n"


async def test_exec_over_the_shell_reports_the_new_programs_status(sb: Sandbox) -> None:
    async with sb.shell() as sh:
        await sh.run("cd /tmp")
        assert (await sh.run("cd /; exec sh -c 'exit 6'")).returncode == 6
        assert (await sh.run("pwd")).stdout == "/tmp\n"


async def test_output_cap_and_check_as_for_exec(sb: Sandbox) -> None:
    async with sb.shell(max_output_bytes=1000) as sh:
        r = await sh.run("yes")
        assert r.truncated and len(r.stdout) <= 1000
        with pytest.raises(cwa.SandboxExecutionError):
            await sh.run("false", check=True)
