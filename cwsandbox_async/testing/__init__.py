"""Test helpers users can import: the FakeBackend and the backend contract suite."""

from __future__ import annotations

from .fake import ExecHandler, FakeBackend, Faults, Latency

__all__ = ["ExecHandler", "FakeBackend", "Faults", "Latency"]
