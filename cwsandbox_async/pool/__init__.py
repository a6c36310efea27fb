"""The sandbox pool: pre-warmed sandboxes leased to rollout coroutines."""

from __future__ import annotations

from ._lease import Lease
from ._pool import ResetHook, SandboxPool
from ._types import PoolState, PoolStatistics

__all__ = ["Lease", "PoolState", "PoolStatistics", "ResetHook", "SandboxPool"]
