"""The library's log records, in a program that configured no logging: warnings say who wrote them,
nothing below WARNING is printed, and the library installs no handler of its own.

Python prints a record no handler takes through ``logging.lastResort``, which writes the bare message;
run in a fresh interpreter, since pytest itself configures logging.
"""

from __future__ import annotations

import subprocess
import sys

from guards import HANG_GUARD_SECONDS

UNCONFIGURED = """
import logging
from cwsandbox_async._log import log
log.debug("a debug event", k=1)
log.info("an info event", k=2)
log.warning("a warning event", k=3)
log.error("an error event", k=4)
assert not logging.getLogger("cwsandbox_async").handlers and not logging.getLogger().handlers
"""

CONFIGURED = """
import logging
logging.basicConfig(format="%(levelname)s|%(name)s|%(message)s")
from cwsandbox_async._log import log
log.warning("a warning event", k=3)
"""


def python(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=HANG_GUARD_SECONDS, check=True
    )


def test_an_unconfigured_program_sees_warnings_with_the_loggers_name_and_nothing_quieter() -> None:
    ran = python(UNCONFIGURED)
    assert ran.stderr.splitlines() == [
        "WARNING:cwsandbox_async:a warning event k=3",
        "ERROR:cwsandbox_async:an error event k=4",
    ]
    assert ran.stdout == ""


def test_a_configured_program_formats_the_record_itself() -> None:
    ran = python(CONFIGURED)
    assert ran.stderr.splitlines() == ["WARNING|cwsandbox_async|a warning event k=3"]  # the name once
