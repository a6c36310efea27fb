"""Package-level promises: the export list, lazy imports, quiet logging, structured log context."""

from __future__ import annotations

import subprocess
import sys

import structlog

import cwsandbox_async as cwa
from cwsandbox_async import _log
from cwsandbox_async.testing import FakeBackend


def test_all_is_sorted_and_complete() -> None:
    assert list(cwa.__all__) == sorted(cwa.__all__)
    for name in cwa.__all__:
        assert hasattr(cwa, name), name
    public = {n for n in dir(cwa) if not n.startswith("_")}
    leaked = (
        public - set(cwa.__all__) - {"annotations", "backends", "testing", "reporters", "integrations", "cli", "pool"}
    )
    assert leaked == set(), f"names exported without being in __all__: {sorted(leaked)}"


def test_import_is_lazy() -> None:
    code = (
        "import sys, cwsandbox_async\n"
        "heavy = [m for m in ('wandb', 'aiohttp', 'cwsandbox_async.backends.local',"
        " 'cwsandbox_async.backends.kubernetes', 'kubernetes') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_library_is_quiet_by_default() -> None:
    code = (
        "import anyio, cwsandbox_async as cwa\n"
        "from cwsandbox_async.testing import FakeBackend, Faults\n"
        "async def main():\n"
        "    async with cwa.Session(backend=FakeBackend()) as s:\n"
        "        sb = await s.sandbox()\n"
        "        await sb.exec(['echo', 'x'])\n"
        "        await s.sweep(['none'])\n"
        "anyio.run(main)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert (out.stdout, out.stderr) == ("", "")


async def test_events_carry_session_and_sandbox_ids() -> None:
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        async with cwa.Session(backend=FakeBackend()) as s:
            sb = await s.sandbox()
            await sb.stop()
    created = [e for e in logs if e["event"] == "sandbox created"]
    destroyed = [e for e in logs if e["event"] == "sandbox destroyed"]
    assert created and destroyed
    assert created[0]["sandbox_id"] == sb.sandbox_id == destroyed[0]["sandbox_id"]
    assert all(e.get("session_id") == s.session_id for e in created + destroyed)
    assert _log.log is not None
