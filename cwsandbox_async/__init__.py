"""cwsandbox_async: asyncio-native sandboxes for RL training (pools, gatherer, per-step metrics).

Backends are imported lazily by name; ``import cwsandbox_async`` imports none of
them, nor aiohttp's websocket code, nor wandb.
"""

from ._errors import (
    ImagePullError,
    PoolClosedError,
    PoolError,
    PoolTimeoutError,
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxError,
    SandboxExecutionError,
    SandboxFileError,
    SandboxNotFoundError,
    SandboxNotRunningError,
    SandboxNotSupportedError,
    SandboxTerminatedError,
    SandboxTimeoutError,
    SandboxTransportError,
    SandboxValidationError,
)
from ._process import Process
from ._sandbox import Sandbox
from ._session import Session
from ._settings import Timeouts
from ._shell import Shell
from ._transfer import Transfer
from ._types import (
    ExecOutcome,
    ExecResult,
    Resources,
    SandboxDefaults,
    SandboxInfo,
    SandboxStatus,
)
from .gatherer._feed import GatherStatistics
from .gatherer._gather import OutcomeStream, as_completed, gather
from .gatherer._grpo import GroupedOutcomes, gather_groups
from .gatherer._outcome import Outcome, OutcomeKind
from .gatherer._wait import wait
from .metrics._snapshot import MetricsSnapshot
from .pool import Lease, PoolState, PoolStatistics, SandboxPool

ProcessResult = ExecResult  # the CoreWeave SDK's name

__version__ = "0.1.0"

__all__ = [
    "ExecOutcome",
    "ExecResult",
    "GatherStatistics",
    "GroupedOutcomes",
    "ImagePullError",
    "Lease",
    "MetricsSnapshot",
    "Outcome",
    "OutcomeKind",
    "OutcomeStream",
    "PoolClosedError",
    "PoolError",
    "PoolState",
    "PoolStatistics",
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
    "SandboxNotFoundError",
    "SandboxNotRunningError",
    "SandboxNotSupportedError",
    "SandboxPool",
    "SandboxStatus",
    "SandboxTerminatedError",
    "SandboxTimeoutError",
    "SandboxTransportError",
    "SandboxValidationError",
    "Session",
    "Shell",
    "Timeouts",
    "Transfer",
    "__version__",
    "as_completed",
    "gather",
    "gather_groups",
    "wait",
]
