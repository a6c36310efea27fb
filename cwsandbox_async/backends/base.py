"""The backend contract: the handful of async methods a backend implements.

A backend is the only layer that knows about processes, namespaces, pods or
sockets. Everything above it (Session, Sandbox, SandboxPool, the gatherer,
metrics) is written once against this class. Cross-cutting behaviour (deadlines,
retries, metrics, validation) lives above it: a backend receives validated input
and does one thing per call.

Rules every implementation follows (``cwsandbox_async.testing.contract`` checks them):

- **Errors are translated at this boundary, from a fixed list.** A backend maps
  the foreign exceptions it *knows* (``OSError`` from its own syscalls, aiohttp
  or gRPC errors, Kubernetes ``Status`` objects, agent protocol errors) into the
  ``SandboxError`` tree (``raise ... from exc``). Anything it does not know is a
  bug: it propagates unchanged and is never relabelled as infrastructure.
- **``infrastructure`` is honest.** ``infrastructure=True`` only for what neither
  the program under test nor its caller could cause: the sandbox or backend
  failed for outside reasons, a transport broke, the platform starved the
  program. The program's own outcome (exit code, its timeout, its OOM kill, its
  CPU budget, the output cap, killing its own agent) is a result or a
  non-infrastructure error. Caller mistakes raise ``infrastructure=False``.
- ``create`` returns only when the sandbox is ready to run commands. The caller
  picks the sandbox id. If ``create`` fails or is cancelled, the caller calls
  ``destroy(sandbox_id)``, so ``destroy`` accepts ids of half-created sandboxes.
- ``exec`` enforces ``request.timeout_seconds`` itself by killing the command's
  whole process tree, and returns an ``ExecExit`` with ``timed_out=True`` and the
  output captured so far. Output beyond ``request.max_output_bytes`` (per stream)
  is dropped, the command is killed and ``truncated=True``. A non-zero exit is a
  normal return. ``ExecExit`` carries the facts a verdict needs where the backend
  can tell them (``oom_killed``, ``cpu_exceeded``, ``cpu_wait_seconds``). An exec
  the backend abandons (cancelled, timed out, truncated) leaves no process behind.
  ``request.cpu_priority`` (always with ``exclusive`` and a ``cpu_seconds`` budget)
  asks for the sandbox to get the CPU before the other sandboxes while the command
  runs: a backend with a mechanism grants it out of the program's reach and takes
  it back when the exec ends, however it ends (the local backend: its cgroup's CPU
  weight); a backend without one (Kubernetes, CoreWeave, the fake) ignores it and
  runs the command at its usual share.
  A broken channel raises ``SandboxTransportError``; a sandbox that is gone raises
  ``SandboxNotRunningError``.
- ``destroy`` is idempotent: destroying an unknown or already destroyed sandbox
  is not an error. It releases every process, pod and file descriptor.
- ``list`` finds sandboxes by tags (all must match), including ones created by
  other processes of this user that are still alive or were left behind.
- ``attach`` reaches a sandbox another process created (the same user's, or any for root where the
  platform has users), by id; the default raises ``SandboxNotSupportedError``. An unknown, dead or
  foreign id raises ``SandboxNotFoundError``. Without ``adopt`` the backend's ``aclose`` lets go of
  it without stopping it.
- ``owns`` says whether this backend instance created a sandbox and has not
  destroyed it; ``sweep`` spares those unless asked (``include_own``). The base
  class's ``sweep`` lists, then destroys one by one; a backend with a bulk delete
  (Kubernetes ``deletecollection``, CoreWeave ``PurgeSandboxes``) overrides it and
  keeps the same guard (``validate_sweep``: tags or an age, never everything).
  Destroyed ids are remembered with ``backends._shared.DestroyedIds``.
- **Deadlines and cancellation come from the caller.** Cancellation is never
  swallowed. The caller bounds every call with a deadline (an anyio cancel
  scope); a backend never opens a shielded scope with a budget of its own, so a
  close budget set above holds all the way down (the one exception left: the
  local plain path's reap of a killed command, at most 5 s, ``local/_plain.py``).
  Blocking work (file trees, ``/proc`` scans, subprocess waits) runs in a worker
  thread, not on the loop.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar

from .._errors import SandboxNotSupportedError
from .._types import ExecExit, ExecRequest, SandboxDefaults, SandboxInfo, SandboxSpec, SandboxStatus, StreamName
from .._validate import validate_sweep
from ._shared import destroy_each, sweep_victims

__all__ = ["Backend", "OutputCallback"]

#: Receives output chunks as they arrive, when a caller streams (``Sandbox.process``).
OutputCallback = Callable[[StreamName, bytes], Awaitable[None]]


class Backend(abc.ABC):
    """A place sandboxes run. Subclass it to add one; see the module docstring for the rules."""

    #: Short name used in logs, metrics and ``SandboxInfo.backend``.
    name: str = "backend"
    #: Whether the backend uses asyncio's own APIs (loop callbacks, aiohttp, grpc.aio). ``Session`` refuses
    #: one that does when it is not opened on asyncio (``anyio.run(..., backend="trio")``); a backend written
    #: with anyio alone sets it False.
    asyncio_only: ClassVar[bool] = True

    @property
    def isolation(self) -> str:
        """What isolates sandboxes here (e.g. ``"bwrap"``, ``"unshare"``, ``"pod"``, ``"none"``)."""
        return "unknown"

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> None:
        """Start a sandbox with id ``spec.sandbox_id`` and return when it is ready."""

    @abc.abstractmethod
    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        """Run one command to completion (or timeout), streaming output to ``on_output`` if given."""

    async def run_python(
        self, sandbox_id: str, source: str, request: ExecRequest, on_output: OutputCallback | None = None
    ) -> ExecExit:
        """Run Python ``source`` with ``request``'s cwd, env, stdin, timeout and output cap.

        The default runs ``("python3", "-I", "-c", source)`` through ``exec`` (``request.argv``
        is ignored): isolated mode, so no ``PYTHON*`` variable, user site directory or working
        directory decides what runs before ``source`` (a ``sitecustomize.py`` an earlier command
        wrote on ``PYTHONPATH`` does not). A backend with a warm interpreter (the local agent)
        overrides it with something faster that keeps the same results: exit code 0, the
        ``SystemExit`` code, or 1 after an uncaught exception.
        """
        argv = ("python3", "-I", "-c", source)
        return await self.exec(sandbox_id, dataclasses.replace(request, argv=argv), on_output)

    @abc.abstractmethod
    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        """Return a file's contents; ``SandboxFileError`` if missing, a directory, or larger than max_bytes."""

    @abc.abstractmethod
    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        """Create or replace a file (parents created); ``SandboxFileError`` where it may not be written."""

    @abc.abstractmethod
    async def destroy(self, sandbox_id: str) -> None:
        """Stop a sandbox and release everything it holds. Idempotent."""

    @abc.abstractmethod
    async def status(self, sandbox_id: str) -> SandboxStatus:
        """The sandbox's current status (``FAILED``/``COMPLETED`` once it is gone)."""

    @abc.abstractmethod
    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        """Sandboxes carrying all of ``tags``, including leftovers of other processes."""

    def owns(self, sandbox_id: str) -> bool:
        """Whether this backend instance created ``sandbox_id`` and has not destroyed it (``sweep`` spares
        those). False by default: a backend that does not say spares nothing, so override it."""
        return False

    async def sweep(
        self, tags: Sequence[str], *, older_than_seconds: float | None = None, include_own: bool = False
    ) -> builtins.list[str]:
        """Destroy the sandboxes carrying all of ``tags`` (leftovers of crashed drivers), only those older
        than ``older_than_seconds`` if given, and the ones this backend ``owns`` only with ``include_own``.
        Returns the ids destroyed.

        ``SandboxValidationError`` without tags and without an age (``validate_sweep``). The default
        lists, then destroys each concurrently; a sandbox whose destroy fails is logged and left out of
        the result. The caller bounds the call."""
        wanted, min_age = validate_sweep(tags, older_than_seconds)
        spare = (lambda _: False) if include_own else self.owns
        victims = sweep_victims(await self.list(wanted), min_age, spare)
        return await destroy_each(victims, self.destroy, self.name)

    async def set_lifetime(self, sandbox_id: str, seconds: float | None) -> None:  # noqa: B027 - optional hook
        """End the sandbox's life ``seconds`` from now even if this process dies (None: the backend's default).

        A server-side bound, for backends whose sandboxes outlive a killed driver
        (Kubernetes: the pod's ``activeDeadlineSeconds``). ``SandboxPool`` calls it when a
        lease with a hold timeout starts (through ``Sandbox.set_lifetime``), with the hold
        timeout plus the pool's ``lifetime_margin_seconds``. A no-op by default (local sandboxes die with their
        driver). Raises a ``SandboxError`` if the lifetime cannot be set (a backend that
        can only shorten a lifetime raises ``SandboxValidationError`` for a later end);
        the pool then does not hand that sandbox out. The caller bounds the call.
        """

    async def attach(
        self, sandbox_id: str, defaults: SandboxDefaults, *, session_id: str, adopt: bool = False
    ) -> SandboxDefaults:
        """Reach a sandbox another process or session created, and hold it as if this backend had created it:
        every call works on it; ``destroy`` stops it. ``adopt``: this backend now owns it (``owns`` is True,
        ``aclose`` stops it, and its creator no longer does where the backend can say so); without it,
        ``aclose`` only lets go of it. Returns ``defaults`` with what the backend knows of the sandbox in
        their place (``tags``, ``working_dir``, ``env``).

        ``SandboxNotFoundError`` for an id this caller cannot reach (unknown, gone, another user's);
        ``SandboxNotSupportedError`` where the backend cannot attach (this default). The caller bounds it."""
        raise SandboxNotSupportedError(
            f"the {self.name} backend cannot attach to a sandbox by id", sandbox_id=sandbox_id
        )

    async def aclose(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release the backend's own resources (connections, watches). Sandboxes are destroyed first."""
