"""The library's exception tree.

Every error a user can see from this package is one of these. Backends translate
their low-level errors (``OSError``, ``aiohttp`` errors, Kubernetes ``Status``
objects, agent protocol errors) into this tree at their boundary, once, with
``raise ... from exc`` so the cause stays inspectable.

```
SandboxError
├── SandboxValidationError        bad input; never reached a backend
├── SandboxBackendUnavailableError backend cannot be used here (no bwrap, no cluster, ...)
├── SandboxCreationError          a sandbox failed to start
├── SandboxNotRunningError        the sandbox is gone or not running
│   └── SandboxTerminatedError    ... because this client stopped it
├── SandboxTimeoutError           a deadline passed (``.result`` holds partial output of an exec)
│   └── PoolTimeoutError          no sandbox could be leased in time
├── SandboxExecutionError         ``check=True`` and the command exited non-zero (``.exec_result``)
├── SandboxFileError              read/write failed (``.path``)
├── SandboxTransportError         the channel to the sandbox broke (agent died, socket dropped)
├── ImagePullError                an image could not be pulled or unpacked (``.reference``)
└── PoolError
    └── PoolClosedError           the pool is closed
```

``infrastructure`` tells whether an error is the platform's fault rather than
the program's own outcome or the caller's mistake: a trainer drops
infrastructure failures from reward statistics (GRPO masks them) instead of
reading them as a zero reward, so the flag must never be something a program or
its caller can trigger on purpose. It is decided where the facts are, per
instance (``infrastructure=``), with a default per class:

- **the program's outcome** (``False``): its exit code, its own timeout, its OOM
  kill, its CPU budget and the output cap are *results* (``ExecResult``), and a
  command timeout is ``SandboxTimeoutError(infrastructure=False)``; a sandbox the
  program took down (it killed its agent, exhausted its memory) raises
  ``SandboxNotRunningError(infrastructure=False)`` for that exec and every later
  call;
- **the caller's mistake** (``False``): bad input (``SandboxValidationError``),
  using a stopped sandbox (``SandboxTerminatedError``), a session or pool that is
  not open, ``check=True`` (``SandboxExecutionError``), a missing file;
- **the platform's failure** (``True``): the sandbox died for reasons outside the
  program, a transport broke, a backend stopped answering within its deadline, a
  sandbox could not be created, an exec timed out while the program was starved
  of CPU by others (``SandboxTimeoutError`` with ``result.starved``).

An exception a backend does not know is a bug: it propagates as itself and is
never wrapped into this tree as infrastructure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._types import ExecResult

__all__ = [
    "ImagePullError",
    "PoolClosedError",
    "PoolError",
    "PoolTimeoutError",
    "SandboxBackendUnavailableError",
    "SandboxCreationError",
    "SandboxError",
    "SandboxExecutionError",
    "SandboxFileError",
    "SandboxNotFoundError",
    "SandboxNotRunningError",
    "SandboxNotSupportedError",
    "SandboxTerminatedError",
    "SandboxTimeoutError",
    "SandboxTransportError",
    "SandboxValidationError",
]


class SandboxError(Exception):
    """Root of every error raised by this library.

    ``infrastructure`` defaults per class; the place that raises an error and
    knows better passes ``infrastructure=`` explicitly.
    """

    infrastructure: bool = True

    def __init__(self, message: str, *, sandbox_id: str | None = None, infrastructure: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sandbox_id = sandbox_id
        if infrastructure is not None:
            self.infrastructure = infrastructure


class SandboxValidationError(SandboxError, ValueError):
    """Bad input (empty argv, NUL bytes, relative paths, negative timeouts...)."""

    infrastructure = False


class SandboxBackendUnavailableError(SandboxError):
    """The backend cannot be used on this machine or cannot be reached."""


class SandboxCreationError(SandboxError):
    """A sandbox failed to start (process died, pod failed, image pull error...)."""

    def __init__(
        self,
        message: str,
        *,
        sandbox_id: str | None = None,
        reason: str | None = None,
        infrastructure: bool | None = None,
    ) -> None:
        super().__init__(message, sandbox_id=sandbox_id, infrastructure=infrastructure)
        self.reason = reason


class SandboxNotRunningError(SandboxError):
    """The sandbox is not running (it died, was evicted, or never started)."""


class SandboxNotFoundError(SandboxNotRunningError):
    """No sandbox with that id that this caller may reach (``Session.attach``): unknown, gone, or another
    user's (which the caller cannot tell apart from unknown). The caller's: ``infrastructure=False``."""

    infrastructure = False


class SandboxNotSupportedError(SandboxError, NotImplementedError):
    """The backend cannot do this (for example ``attach`` on a backend without it, or a sandbox with no
    agent to attach to). The caller's choice of backend: ``infrastructure=False``."""

    infrastructure = False


class SandboxTerminatedError(SandboxNotRunningError):
    """The sandbox was stopped by this client and can no longer be used: the caller's doing, not infrastructure."""

    infrastructure = False


class SandboxTimeoutError(SandboxError, TimeoutError):
    """A deadline passed.

    For an exec timeout, the whole process tree was killed and ``result`` holds the
    output captured up to that point. Such a timeout is the program's outcome, so
    ``infrastructure`` is False for it, unless the backend measured that the
    program was starved of CPU by others (``result.starved``: see
    ``docs/outcomes.md``); it is True for an operation timeout (create, file
    transfer, a backend that stopped answering).
    """

    def __init__(
        self,
        message: str,
        *,
        sandbox_id: str | None = None,
        result: ExecResult | None = None,
        infrastructure: bool = True,
    ) -> None:
        super().__init__(message, sandbox_id=sandbox_id, infrastructure=infrastructure)
        self.result = result


class PoolTimeoutError(SandboxTimeoutError):
    """No sandbox could be leased from the pool before the lease deadline."""


class SandboxExecutionError(SandboxError):
    """``check=True`` was given and the command exited non-zero."""

    infrastructure = False

    def __init__(self, message: str, *, sandbox_id: str | None = None, exec_result: ExecResult) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.exec_result = exec_result


class SandboxFileError(SandboxError):
    """A file could not be read or written (missing, a directory, too large, denied)."""

    infrastructure = False

    def __init__(self, message: str, *, sandbox_id: str | None = None, path: str | None = None) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.path = path

    @property
    def filepath(self) -> str | None:
        """The CoreWeave SDK's name for ``path``."""
        return self.path


class SandboxTransportError(SandboxError):
    """The channel to the sandbox broke: the agent died, a socket dropped, a stream ended early."""


class ImagePullError(SandboxError):
    """An image could not be pulled or unpacked.

    The caller's (``infrastructure=False``, the registry's words in the message): an image or tag
    that does not exist, credentials the registry refuses, no manifest for the platform, a layer
    the unpacker refuses. The platform's (``True``): a digest that does not match, a registry
    answering 5xx or not at all. Nothing half-pulled is kept either way.
    """

    def __init__(self, message: str, *, reference: str | None = None, infrastructure: bool | None = None) -> None:
        super().__init__(message, infrastructure=infrastructure)
        self.reference = reference


class PoolError(SandboxError):
    """A pool could not serve a request."""


class PoolClosedError(PoolError):
    """The pool is closed (or closing) and takes no new leases."""
