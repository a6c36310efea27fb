"""The test server's documented start command, as a user's CI runs it: a process of its own, stopped by SIGTERM.

A dependency (``cint``, via the ``art`` extra's weave) installs a top-level ``tests`` package into
site-packages, which is why the server lives in the package: here a ``tests`` package that shadows
this repository's is first on the path, and the command still works.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
from guards import HANG_GUARD_SECONDS

from cwsandbox_async.backends.coreweave import CoreWeaveBackend
from cwsandbox_async.testing.contract import make_request, make_spec


async def test_the_start_command_serves_and_stops_cleanly(tmp_path: Path) -> None:
    shadow = tmp_path / "tests"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('a foreign tests package')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "cwsandbox_async.testing.coreweave", "--api-key", "ci-key"]
    async with await anyio.open_process(argv, env=env, cwd=tmp_path) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            with anyio.fail_after(HANG_GUARD_SECONDS):
                first = b""
                while not first.endswith(b"\n"):
                    first += await proc.stdout.receive(1)
            url = first.decode().strip()
            assert url.startswith("http://127.0.0.1:"), url
            backend = CoreWeaveBackend(base_url=url, api_key="ci-key", ready_poll_seconds=0.02)
            try:
                spec = make_spec("ci")
                await backend.create(spec)
                r = await backend.exec(spec.sandbox_id, make_request("python", "-c", "print(6*7)"))
                assert (r.returncode, r.stdout) == (0, b"42\n")
                assert backend.channel is not None and backend.channel.unary_exec is False  # only the SDK's RPCs
            finally:
                await backend.aclose()
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(HANG_GUARD_SECONDS):
                rc = await proc.wait()
            assert rc == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                with anyio.CancelScope(shield=True):
                    await proc.wait()
