"""The sandbox pool: pre-warmed sandboxes leased to rollout coroutines (see ``SandboxPool``)."""

from __future__ import annotations

from ._lease import Lease
from ._options import PoolOptions, ResetHook
from ._pool import SandboxPool
from ._types import PoolState, PoolStatistics

__all__ = ["Lease", "PoolOptions", "PoolState", "PoolStatistics", "ResetHook", "SandboxPool"]
