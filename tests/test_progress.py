"""The gatherer's tqdm bar: on stderr when it is a terminal (a real pty here), never in logs or pipes."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from guards import HANG_GUARD_SECONDS

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tqdm") is None, reason="needs the progress extra (tqdm)")

#: 12 items of ``seconds`` each, 4 at a time: 3 waves.
PROGRAM = """
import asyncio, sys
import cwsandbox_async as cwa
progress = {"auto": None, "on": True, "off": False}[sys.argv[1]]
seconds = float(sys.argv[2])
async def item():
    await asyncio.sleep(seconds)
    return 1
async def main():
    outcomes = await cwa.gather([item for _ in range(12)], limit=4, progress=progress)
    print("sum", sum(o.value for o in outcomes), flush=True)
asyncio.run(main())
"""


def run(mode: str, seconds: float, *, tty: bool) -> tuple[str, str]:
    """Run PROGRAM with stderr on a pty (a terminal) or a pipe; return (stdout, stderr)."""
    if not tty:
        proc = subprocess.run(
            [sys.executable, "-c", PROGRAM, mode, str(seconds)],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_SECONDS,
            check=True,
        )
        return proc.stdout, proc.stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a size
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", PROGRAM, mode, str(seconds)], stdout=subprocess.PIPE, stderr=slave, text=True
        )
        os.close(slave)
        chunks: list[bytes] = []
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the pty
                    break
                if not data:
                    break
                chunks.append(data)
            elif child.poll() is not None:
                break
        out, _ = child.communicate(timeout=HANG_GUARD_SECONDS)
        assert child.returncode == 0
        return out, b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)


def test_auto_mode_draws_a_bar_on_a_terminal_for_a_long_batch_and_removes_it() -> None:
    out, err = run("auto", 0.4, tty=True)  # 3 waves of 0.4 s: past the 1 s delay
    assert out == "sum 12\n"
    assert "12/12" in err or "item/s" in err, repr(err)


def test_auto_mode_shows_nothing_when_stderr_is_not_a_terminal() -> None:
    out, err = run("auto", 0.4, tty=False)
    assert (out, err) == ("sum 12\n", "")


def test_short_batches_and_progress_false_show_nothing_even_on_a_terminal() -> None:
    assert run("auto", 0.01, tty=True) == ("sum 12\n", "")  # done before the delay
    assert run("off", 0.4, tty=True) == ("sum 12\n", "")


def test_progress_true_shows_the_bar_anywhere_and_keeps_it() -> None:
    out, err = run("on", 0.01, tty=False)
    assert out == "sum 12\n" and "12/12" in err
