"""Hostile output and input: gigabyte floods, invalid UTF-8, NUL bytes, huge stdin and argv."""

from __future__ import annotations

import hashlib
import os

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async._validate import MAX_ARGV_BYTES

from .conftest import arena, requires_isolation

pytestmark = requires_isolation

GIB = 1 << 30
FLOODS = {
    "stdout": f"head -c {GIB} /dev/zero",
    "stderr": f"head -c {GIB} /dev/zero >&2",
    "both": f"head -c {GIB} /dev/zero & head -c {GIB} /dev/zero >&2; wait",
}
PY_FLOOD = "import sys\nb = b'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.buffer.write(b)\n"
# What a flood says if it was left to write to its end.
DONE = "sys.stderr.write('flood done')\n"
DONE_SH = "; echo flood done >&2"


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("flood", [*FLOODS, "run_python"])
async def test_a_gigabyte_of_output_is_cut_at_the_cap_quickly(tag: str, flood: str) -> None:
    cap = 16 * 1024 * 1024  # the default max_output_bytes
    async with arena(tag) as a:
        rss = rss_bytes()
        with anyio.fail_after(HANG_GUARD_SECONDS):
            if flood == "run_python":
                r = await a.victim.run_python(PY_FLOOD + DONE, timeout_seconds=HANG_GUARD_SECONDS)
            else:
                r = await a.victim.exec(FLOODS[flood] + DONE_SH, timeout_seconds=HANG_GUARD_SECONDS)
        assert r.truncated and not r.timed_out
        assert len(r.stdout_bytes) <= cap and len(r.stderr_bytes) <= cap
        assert len(r.stdout_bytes) + len(r.stderr_bytes) >= cap  # cut at the cap, not before
        # Ended at the cap (quickly, at any load), killed there, the whole command: not left to write
        # its gigabyte to the end, and not its writer alone dying of SIGPIPE while the shell runs on.
        assert r.returncode == -9 and "flood done" not in r.stderr, (r.returncode, r.stderr[-200:])
        # The driver held at most the capped output, never the gigabyte.
        assert rss_bytes() - rss < 8 * cap
        ps = await a.victim.exec(["ps", "-eo", "args"])
        assert "head -c" not in ps.stdout and "sys.stdout" not in ps.stdout


async def test_streaming_a_flood_is_capped_too(tag: str) -> None:
    cap = 1 << 20
    async with arena(tag) as a:
        received = 0
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with a.victim.process(["yes"], max_output_bytes=cap, timeout_seconds=HANG_GUARD_SECONDS) as p:
                async for chunk in p.stdout:
                    received += len(chunk)
                r = await p.wait()
        assert r.truncated and received == cap == len(r.stdout_bytes)


async def test_an_invalid_utf8_flood_arrives_byte_exact(tag: str) -> None:
    size = 8 << 20
    async with arena(tag) as a:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            r = await a.victim.exec(f"head -c {size} /dev/urandom | tee /tmp/sent", timeout_seconds=HANG_GUARD_SECONDS)
            digest = (await a.victim.exec(["sha256sum", "/tmp/sent"])).stdout.split()[0]
        assert not r.truncated and len(r.stdout_bytes) == size
        assert hashlib.sha256(r.stdout_bytes).hexdigest() == digest
        text = r.stdout  # decoding never raises: invalid sequences become U+FFFD
        assert "\ufffd" in text
        r = await a.victim.exec("head -c 100000 /dev/urandom >&2; printf '\\377\\376\\n'")
        assert r.stdout_bytes == b"\xff\xfe\n" and r.stdout == "\ufffd\ufffd\n"
        assert len(r.stderr_bytes) == 100000


async def test_nul_bytes_pass_through_data_and_are_refused_in_names(tag: str) -> None:
    blob = bytes(range(256)) * 64 + b"\x00" * 4096
    async with arena(tag) as a:
        r = await a.victim.exec(["cat"], stdin=blob)
        assert r.stdout_bytes == blob
        r = await a.victim.exec(["printf", "a\\0b\\0"])
        assert r.stdout_bytes == b"a\x00b\x00" and r.stdout == "a\x00b\x00"
        await a.victim.write_file("/workspace/blob", blob)
        assert await a.victim.read_file("/workspace/blob") == blob
        assert (await a.victim.exec(["wc", "-c", "/workspace/blob"])).stdout.split()[0] == str(len(blob))
        count = a.victim.exec_stats["exec_count"]
        bad = [
            a.victim.exec(["echo", "a\x00b"]),
            a.victim.exec("echo a\x00b"),
            a.victim.exec(["true"], env={"X": "a\x00b"}),
            a.victim.exec(["true"], cwd="/work\x00space"),
            a.victim.read_file("/workspace/blob\x00.txt"),
            a.victim.write_file("/workspace/\x00", b"x"),
            a.victim.run_python("print(1)\x00"),
        ]
        for call in bad:
            with pytest.raises(cwa.SandboxValidationError):
                await call
        assert a.victim.exec_stats["exec_count"] == count  # none reached the backend


async def test_huge_stdin_arrives_whole(tag: str) -> None:
    data = os.urandom(1 << 20) * 64  # 64 MiB
    async with arena(tag) as a:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            r = await a.victim.exec(["sha256sum"], stdin=data, timeout_seconds=HANG_GUARD_SECONDS)
            r2 = await a.victim.run_python(
                "import sys, hashlib; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())", stdin=data
            )
        digest = hashlib.sha256(data).hexdigest()
        assert r.stdout.split()[0] == digest and r2.stdout.strip() == digest
        # A reader that stops early: the rest of stdin is simply not read.
        r = await a.victim.exec(["head", "-c", "10"], stdin=data)
        assert r.stdout_bytes == data[:10] and r.returncode == 0


async def test_huge_argv_is_a_clear_result_or_a_validation_error(tag: str) -> None:
    async with arena(tag) as a:
        many = ["y" * 1000] * 900  # ~900 KB in total, each argument small: the kernel takes it
        r = await a.victim.exec(["echo", *many])
        assert r.returncode == 0 and r.stdout == " ".join(many) + "\n"
        # One argument over the kernel's 128 KiB per-string limit: a clean exit code, not a broken channel.
        r = await a.victim.exec(["echo", "x" * 200_000])
        assert r.returncode == 126 and "Argument list too long" in r.stderr
        with pytest.raises(cwa.SandboxValidationError):
            await a.victim.exec(["echo", "z" * (MAX_ARGV_BYTES + 1)])
        assert (await a.victim.exec(["echo", "after"])).stdout == "after\n"
