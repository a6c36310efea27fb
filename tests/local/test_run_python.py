"""Sandbox.run_python: Python source in a fork of the agent's warm interpreter, with exec's semantics."""

from __future__ import annotations

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.backends.base import Backend
from cwsandbox_async.testing.contract import make_request, make_spec

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation

PROBE = """
import os, sys
print(sys.argv, os.getcwd(), os.environ.get("X"), sys.stdin.read())
print("typing" in sys.modules, __name__)
print("err", file=sys.stderr)
"""


async def test_run_python_output_exit_codes_and_io(tag: str) -> None:
    async with local_session(tag, env={"X": "sandbox-default"}) as s:
        sb = await s.sandbox()
        r = await sb.run_python(PROBE, stdin=b"in!", cwd="/tmp")
        assert r.stdout == "['-c'] /tmp sandbox-default in!\nTrue __main__\n"
        assert (r.returncode, r.stderr) == (0, "err\n")
        assert r.command[:3] == ("python3", "-I", "-c")
        r = await sb.run_python("import os; print(os.environ['X'])", env={"X": "per-call"})
        assert r.stdout == "per-call\n"
        assert (await sb.run_python("raise SystemExit(3)")).returncode == 3
        assert (await sb.run_python("import sys; sys.exit('bye')")).returncode == 1
        r = await sb.run_python("def f():\n    1 / 0\nf()")
        assert r.returncode == 1
        assert r.stderr.startswith("Traceback") and "ZeroDivisionError" in r.stderr and "cwsandbox" not in r.stderr
        r = await sb.run_python("def broken(:\n")
        assert r.returncode == 1 and "SyntaxError" in r.stderr
        with pytest.raises(cwa.SandboxExecutionError):
            await sb.run_python("raise ValueError", check=True)
        r = await sb.run_python("import atexit; atexit.register(print, 'at exit')")
        assert r.stdout == "at exit\n"
        assert sb.exec_stats["exec_count"] == 8


async def test_run_python_is_isolated_from_the_agent_and_between_runs(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        await sb.run_python("import math; math.pi = 3; open('/workspace/state', 'w').write('kept')")
        r = await sb.run_python("import math; print(math.pi, open('/workspace/state').read())")
        assert r.stdout == "3.141592653589793 kept\n"  # module state does not leak, files do
        r = await sb.run_python("import os; os.kill(1, 9); os._exit(4)")
        assert r.returncode == 4
        assert (await sb.exec(["echo", "agent alive"])).stdout == "agent alive\n"


async def test_run_python_timeout_and_output_cap(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxTimeoutError) as info:
            await sb.run_python("print('before', flush=True)\nwhile True: pass", timeout_seconds=1)
        assert info.value.result is not None and info.value.result.stdout == "before\n"
        r = await sb.run_python("while True: print('x' * 1000)", max_output_bytes=10_000)
        assert r.truncated and len(r.stdout_bytes) == 10_000
        r = await sb.run_python(
            "import subprocess; subprocess.Popen(['sleep', '3737'], start_new_session=True); print('ok')"
        )
        assert r.stdout == "ok\n"
        assert "3737" not in (await sb.exec(["ps", "-eo", "args"])).stdout


async def test_default_run_python_goes_through_exec(backend: Backend, tag: str) -> None:
    spec = make_spec(tag)
    await backend.create(spec)
    try:
        req = make_request("ignored", stdin=b"abc")
        fast = await backend.run_python(spec.sandbox_id, "import sys; print(sys.stdin.read())", req)
        slow = await Backend.run_python(backend, spec.sandbox_id, "import sys; print(sys.stdin.read())", req)
        assert fast.stdout == slow.stdout == b"abc\n"
        assert fast.returncode == slow.returncode == 0
    finally:
        await backend.destroy(spec.sandbox_id)


async def test_run_python_waits_for_threads_like_python_does(tag: str) -> None:
    src = "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()"
    async with local_session(tag) as s:
        sb = await s.sandbox()
        assert (await sb.run_python(src)).stdout == "thread done\n"
