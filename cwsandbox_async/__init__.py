"""cwsandbox_async: asyncio-native sandboxes for RL training (pools, gatherer, per-step metrics).

Backends are imported lazily by name; ``import cwsandbox_async`` imports none of
them, nor aiohttp's websocket code, nor wandb.
"""

from __future__ import annotations

from ._errors import (
    PoolClosedError,
    PoolError,
    PoolTimeoutError,
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxError,
    SandboxExecutionError,
    SandboxFileError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxTimeoutError,
    SandboxTransportError,
    SandboxValidationError,
)
from ._sandbox import Process, Sandbox
from ._session import Session
from ._types import (
    ExecOutcome,
    ExecResult,
    Resources,
    SandboxDefaults,
    SandboxInfo,
    SandboxStatus,
)

ProcessResult = ExecResult  # the CoreWeave SDK's name

__version__ = "0.1.0"

__all__ = [
    "ExecOutcome",
    "ExecResult",
    "PoolClosedError",
    "PoolError",
    "PoolTimeoutError",
    "Process",
    "ProcessResult",
    "Resources",
    "Sandbox",
    "SandboxBackendUnavailableError",
    "SandboxCreationError",
    "SandboxDefaults",
    "SandboxError",
    "SandboxExecutionError",
    "SandboxFileError",
    "SandboxInfo",
    "SandboxNotRunningError",
    "SandboxStatus",
    "SandboxTerminatedError",
    "SandboxTimeoutError",
    "SandboxTransportError",
    "SandboxValidationError",
    "Session",
    "__version__",
]
