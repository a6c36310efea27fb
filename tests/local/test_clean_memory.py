"""``run_python`` programs start from memory no request ever touched.

A ``run_python`` program is a fork of the sandbox's PID 1, which never reads a request's bytes (the
driver passes them in memfds only the forked child reads), so this holds by construction. Earlier
requests plant markers everywhere a request's data goes -- file contents (also of a
file deleted since), stdin, environment, output, earlier Python source -- and a later
``run_python`` program reads its whole address space (``/proc/self/maps`` + ``/proc/self/mem``)
looking for them. The scanner knows only the markers' common prefix, never a marker itself, and
proves it can see: a control marker in its own environment must be found.
"""

from __future__ import annotations

import uuid

from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation

SCAN = """
import os, re, sys
needle = sys.argv[1].encode()
found = set()
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if "r" not in parts[1] or (len(parts) > 5 and parts[5].startswith("/") and "w" not in parts[1]):
            continue  # unreadable, or a read-only file mapping (code, not data)
        try:
            data = os.pread(mem.fileno(), hi - lo, lo)
        except OSError:
            continue
        for m in re.finditer(re.escape(needle) + rb"([0-9a-f]{16})", data):
            found.add(m.group(1).decode())
print(" ".join(sorted(found)))
"""


def new_marker(prefix: str) -> tuple[str, str]:
    ident = uuid.uuid4().hex[:16]
    return ident, prefix + ident


async def scan(sb: cwa.Sandbox, prefix: str, control: str) -> set[str]:
    r = await sb.run_python(
        "import sys\nsys.argv[1:] = [" + repr(prefix) + "]\n" + SCAN,
        env={"CONTROL": control},
        timeout_seconds=HANG_GUARD_SECONDS,
    )
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


async def plant(sb: cwa.Sandbox, prefix: str) -> dict[str, str]:
    """Every way a request carries data, each with its own marker; returns {how: marker id}."""
    ids: dict[str, str] = {}

    def mark(how: str) -> str:
        """The marker, repeated: large data lands in the C heap, where freed memory keeps its contents."""
        ident, marker = new_marker(prefix)
        ids[how] = ident
        return " ".join([marker] * 1000)

    await sb.write_file("/workspace/written.txt", mark("write_file").encode())
    await sb.write_file("/tmp/gone", mark("deleted file").encode())
    await sb.exec(["sh", "-c", "cat /tmp/gone > /dev/null && rm /tmp/gone"])
    await sb.exec(["sh", "-c", "cat > /workspace/read.txt"], stdin=mark("read_file").encode())
    assert prefix in (await sb.read_file("/workspace/read.txt")).decode()
    await sb.exec(["cat"], stdin=mark("exec stdin").encode())
    await sb.exec(["sh", "-c", "true"], env={"SECRET": mark("exec env")})
    await sb.exec(["echo", mark("exec argv and output")[:60000]])
    await sb.run_python("import sys; sys.stdin.read()", stdin=mark("run_python stdin").encode())
    await sb.run_python("pass", env={"SECRET": mark("run_python env")})
    await sb.run_python(f"x = {mark('run_python source')!r}; print(x)")
    return ids


async def test_run_python_finds_no_earlier_request_in_its_memory(tag: str) -> None:
    prefix = "cwsmk" + uuid.uuid4().hex[:6] + "-"
    async with local_session(tag) as s:
        sb = await s.sandbox()
        control_id, control = new_marker(prefix)
        assert control_id in await scan(sb, prefix, control)  # the scanner sees its own environment
        ids = await plant(sb, prefix)
        for _ in range(3):  # every fork starts from the same PID 1
            control_id, control = new_marker(prefix)
            found = await scan(sb, prefix, control)
            assert control_id in found
            leaked = {how for how, ident in ids.items() if ident in found}
            assert not leaked, f"a run_python program found earlier requests' data in its memory: {sorted(leaked)}"


async def test_a_python_exec_also_starts_clean(tag: str) -> None:
    """``python3 -c`` through exec is a fresh interpreter (execve): the same scan finds nothing either."""
    prefix = "cwsmk" + uuid.uuid4().hex[:6] + "-"
    async with local_session(tag) as s:
        sb = await s.sandbox()
        ids = await plant(sb, prefix)
        control_id, control = new_marker(prefix)
        r = await sb.exec(
            ["python3", "-I", "-c", SCAN, prefix], env={"CONTROL": control}, timeout_seconds=HANG_GUARD_SECONDS
        )
        found = set(r.stdout.split())
        assert control_id in found
        assert not {how for how, ident in ids.items() if ident in found}
