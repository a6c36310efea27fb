"""Test helpers users can import: the FakeBackend and the backend contract suite.

``ExecExit`` is here for ``exec_handler`` functions that report exact facts (CPU time,
run-queue wait, an OOM kill) instead of ``(returncode, stdout, stderr)``.
"""

from __future__ import annotations

from .._types import ExecExit
from .fake import ExecHandler, FakeBackend, Faults, Latency

__all__ = ["ExecExit", "ExecHandler", "FakeBackend", "Faults", "Latency"]
