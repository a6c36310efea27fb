"""Sandbox: a thin handle over one backend sandbox. No I/O of its own beyond the backend."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from ._deadline import backend_call, destroy
from ._errors import (
    SandboxError,
    SandboxExecutionError,
    SandboxNotRunningError,
    SandboxTerminatedError,
)
from ._log import log
from ._process import Process
from ._requests import validate_exec
from ._sdk import exec_stats
from ._types import ExecOutcome, ExecRequest, ExecResult, SandboxDefaults, SandboxStatus
from ._validate import MAX_FILE_BYTES, validate_count, validate_file_data, validate_path, validate_timeout
from ._verdict import exec_result, timeout_error

if TYPE_CHECKING:
    from pathlib import Path

    from ._budget import CloseBudget
    from ._settings import Timeouts
    from ._shell import Shell
    from ._transfer import Transfer
    from .backends.base import Backend, OutputCallback
    from .metrics._aggregator import MetricsAggregator

__all__ = ["Sandbox", "SandboxOpener"]


class Sandbox:
    """One running sandbox. Create it with ``Session.sandbox()``; stop it with ``stop()`` or ``async with``.

    Every method bounds its backend call with a deadline: an exec by its own
    timeout plus ``timeouts.exec_grace_seconds``, files and status by
    ``operation_timeout_seconds``, a stop by ``timeouts.stop_seconds`` and the
    session's close budget. A missed deadline raises ``SandboxTimeoutError``
    (infrastructure); an exception a backend let escape outside the
    ``SandboxError`` tree is a backend bug and propagates unchanged. Bad input
    raises ``SandboxValidationError`` before anything is sent.
    """

    def __init__(
        self,
        *,
        sandbox_id: str,
        backend: Backend,
        defaults: SandboxDefaults,
        metrics: MetricsAggregator,
        timeouts: Timeouts,
        budget: CloseBudget,
        on_stopped: Callable[[Sandbox], None] | None = None,
        startup_seconds: float = 0.0,
    ) -> None:
        self._id = sandbox_id
        self._backend = backend
        self._defaults = defaults
        self._metrics = metrics
        self._timeouts = timeouts
        self._budget = budget
        self._on_stopped = on_stopped
        self._status = SandboxStatus.RUNNING
        self._created_at = time.time()
        self._started = time.monotonic()
        self.startup_seconds = startup_seconds
        self._exec_count = 0
        self._ok = 0
        self._nonzero = 0
        self._failures = 0
        #: Whether the platform (rather than the program) took the sandbox down, once it is FAILED.
        self._death_is_infra = True
        self._stop_lock = anyio.Lock()

    # -- identity and state ----------------------------------------------------
    @property
    def sandbox_id(self) -> str:
        return self._id

    @property
    def tags(self) -> tuple[str, ...]:
        return self._defaults.tags

    @property
    def defaults(self) -> SandboxDefaults:
        return self._defaults

    @property
    def status(self) -> SandboxStatus:
        """Last known status (cached; ``refresh_status()`` asks the backend)."""
        return self._status

    @property
    def created_at(self) -> float:
        return self._created_at

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def exec_stats(self) -> dict[str, int]:
        """This sandbox's exec counters, under the CoreWeave SDK's keys (a new dict each time).

        - ``exec_count``: every ``exec``, ``run_python`` and ``process`` started (one that validation
          refused is not counted);
        - ``exec_completed_ok``: those that ended with return code 0;
        - ``exec_completed_nonzero``: those that ended with another return code (``check=False``);
        - ``exec_failures``: those that raised, a timeout and ``check=True``'s non-zero exit included.
        """
        return exec_stats(self._exec_count, self._ok, self._nonzero, self._failures)

    async def refresh_status(self) -> SandboxStatus:
        """Ask the backend whether the sandbox is still alive."""
        if self._status.is_terminal:
            return self._status
        with backend_call("status", self._defaults.operation_timeout_seconds, sandbox_id=self._id):
            status = await self._backend.status(self._id)
        if status.is_terminal and not self._status.is_terminal:
            self._status = SandboxStatus.FAILED
        return self._status

    def _check_running(self) -> None:
        if self._status in (SandboxStatus.TERMINATING, SandboxStatus.COMPLETED):
            raise SandboxTerminatedError(f"sandbox {self._id} was stopped", sandbox_id=self._id)  # the caller's
        if self._status is SandboxStatus.FAILED:
            # Whoever caused the death owns what follows: a program that took its sandbox down makes
            # every later call its outcome too; an unexplained death stays the platform's.
            raise SandboxNotRunningError(
                f"sandbox {self._id} is no longer running", sandbox_id=self._id, infrastructure=self._death_is_infra
            )

    # -- exec ------------------------------------------------------------------
    def _request(
        self,
        command: str | Sequence[str],
        timeout_seconds: float | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        max_output_bytes: int | None,
        cpu_seconds: float | None = None,
        exclusive: bool = False,
        cpu_priority: bool = False,
    ) -> ExecRequest:
        d = self._defaults
        req = validate_exec(
            command,
            timeout_seconds=d.exec_timeout_seconds if timeout_seconds is None else timeout_seconds,
            cwd=d.working_dir if cwd is None else cwd,
            env=env,
            stdin=stdin,
            max_output_bytes=d.max_output_bytes if max_output_bytes is None else max_output_bytes,
            cpu_seconds=cpu_seconds,
            exclusive=exclusive,
            cpu_priority=cpu_priority,
        )
        if self._status is not SandboxStatus.RUNNING:
            self._check_running()
        return req

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_seconds: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        check: bool = False,
        max_output_bytes: int | None = None,
        cpu_seconds: float | None = None,
        exclusive: bool = False,
        cpu_priority: bool = False,
    ) -> ExecResult:
        """Run a command and return its result.

        ``command`` is an argv list; a str is run with ``/bin/sh -c``. A non-zero exit
        is returned, not raised, unless ``check=True`` (``SandboxExecutionError``).
        On timeout the whole process tree is killed and ``SandboxTimeoutError`` is
        raised with the output so far in ``.result``: the program's own outcome
        (``infrastructure=False``), unless the backend measured that it was starved of
        CPU by others (``result.starved``, ``infrastructure=True``; see
        ``docs/outcomes.md``). Output past ``max_output_bytes`` per stream is dropped,
        the command is killed, and ``result.truncated`` is set. ``cpu_seconds`` is a
        CPU-time budget for the command's process tree, enforced by the sandbox: past
        it the command is killed and ``result.cpu_exceeded`` is set. An OOM kill is a
        result too (``result.oom_killed``). ``exclusive=True`` kills every other
        process in the sandbox before the command starts, so nothing else can write
        into its output, signal it or trace it. ``cpu_priority=True`` (with ``exclusive``
        and ``cpu_seconds``, else ``SandboxValidationError``) gives the sandbox the CPU
        before other sandboxes while the command runs, where the backend can (the local
        backend with a CPU cgroup; see ``ExecRequest.cpu_priority``); elsewhere it runs
        at its usual share. A sandbox that died raises
        ``SandboxNotRunningError``; a broken channel ``SandboxTransportError``.
        """
        req = self._request(
            command, timeout_seconds, cwd, env, stdin, max_output_bytes, cpu_seconds, exclusive, cpu_priority
        )
        return await self._run(req, check, None)

    async def run_python(
        self,
        source: str,
        *,
        timeout_seconds: float | None = None,
        stdin: bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = False,
        max_output_bytes: int | None = None,
        cpu_seconds: float | None = None,
        exclusive: bool = False,
        cpu_priority: bool = False,
    ) -> ExecResult:
        """Run Python source, as ``exec(["python3", "-I", "-c", source])`` would, on the fastest path the backend has.

        Isolated mode (``-I``): no ``PYTHON*`` variable, user site directory or working directory
        decides what runs before ``source``. The local backend forks its agent's warm interpreter
        instead of starting a new one (about 40 times cheaper than ``python3 -c``); other backends run
        ``python3 -I -c``. Differences from a fresh ``python3 -c`` on the fast path:
        modules the agent preloaded (``typing``, ``math``, ``re``, ``collections`` ...
        see ``LocalBackend(preload=...)``) are already in ``sys.modules``, the
        interpreter ran with ``-I`` (no ``PYTHON*`` variables, no user site), and
        ``sys.argv`` is ``["-c"]``. The exit code is 0, the ``SystemExit`` code, or 1
        after an uncaught exception (its traceback on stderr). Timeout, output cap,
        ``check``, ``cpu_seconds``, ``exclusive``, ``cpu_priority``, ``exec_stats`` and metrics behave
        exactly as for ``exec``; the result's ``command`` is ``("python3", "-I", "-c", source)``.
        """
        argv = ["python3", "-I", "-c", source]
        req = self._request(
            argv, timeout_seconds, cwd, env, stdin, max_output_bytes, cpu_seconds, exclusive, cpu_priority
        )
        return await self._run(req, check, None, python=True)

    def process(
        self,
        command: str | Sequence[str],
        *,
        timeout_seconds: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
        cpu_seconds: float | None = None,
        exclusive: bool = False,
        cpu_priority: bool = False,
    ) -> Process:
        """Start a command whose output is streamed: ``async with sb.process(cmd) as p: async for c in p.stdout``.

        Leaving the block before the command ends kills it. Options as for ``exec``.
        """
        req = self._request(
            command, timeout_seconds, cwd, env, stdin, max_output_bytes, cpu_seconds, exclusive, cpu_priority
        )
        return Process(functools.partial(self._run, req, False))

    async def _run(
        self, req: ExecRequest, check: bool, on_output: OutputCallback | None, *, python: bool = False
    ) -> ExecResult:
        self._exec_count += 1
        sid = self._id
        backend = self._backend
        start = time.monotonic()
        try:
            with backend_call("exec", req.timeout_seconds + self._timeouts.exec_grace_seconds, sandbox_id=sid):
                if python:
                    ex = await backend.run_python(sid, req.argv[-1], req, on_output)  # python3 -I -c SOURCE
                else:
                    ex = await backend.exec(sid, req, on_output)
        except SandboxError as exc:
            self._record_failure(exc, time.monotonic() - start)
            raise
        except BaseException:
            self._failures += 1
            self._metrics.exec_finished(self._id, ExecOutcome.FAILURE, time.monotonic() - start, 0.0)
            raise
        result = exec_result(req, ex, sid, self._defaults)
        if ex.timed_out:
            self._failures += 1
            starved = result.starved
            self._metrics.exec_finished(
                sid,
                ExecOutcome.FAILURE,
                ex.wall_seconds,
                ex.cpu_seconds,
                timed_out=True,
                infrastructure=starved,
                starved=starved,
                oom_killed=ex.oom_killed,
            )
            log.info("exec timed out", sandbox_id=sid, timeout=req.timeout_seconds, starved=starved)
            raise timeout_error(req, result)
        if ex.returncode == 0:
            self._ok += 1
            outcome = ExecOutcome.COMPLETED_OK
        elif check:
            self._failures += 1
            outcome = ExecOutcome.FAILURE
        else:
            self._nonzero += 1
            outcome = ExecOutcome.COMPLETED_NONZERO
        self._metrics.exec_finished(self._id, outcome, ex.wall_seconds, ex.cpu_seconds, oom_killed=ex.oom_killed)
        if check and ex.returncode != 0:
            raise SandboxExecutionError(
                f"command exited with {ex.returncode}: {req.argv[:3]!r}", sandbox_id=self._id, exec_result=result
            )
        return result

    def _record_failure(self, exc: SandboxError, elapsed: float) -> None:
        self._failures += 1
        self._metrics.exec_finished(self._id, ExecOutcome.FAILURE, elapsed, 0.0, infrastructure=exc.infrastructure)
        if isinstance(exc, SandboxNotRunningError) and not self._status.is_terminal:
            self._status = SandboxStatus.FAILED
            self._death_is_infra = exc.infrastructure
        log.info("exec failed", sandbox_id=self._id, error=repr(exc))

    def shell(
        self,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_seconds: float | None = None,
        max_output_bytes: int | None = None,
    ) -> Shell:
        """A persistent bash shell: ``async with sb.shell() as sh: await sh.run("cd repo && export A=1")``.

        The working directory, variables (exported or not), functions, aliases, umask and options carry
        over from one ``run`` to the next; background jobs do not. Each run is one ``exec`` (its exit
        status and output are the exec's, which nothing the run starts can forge), with ``timeout_seconds``
        and ``max_output_bytes`` as defaults for every run (``exec``'s otherwise); ``cwd``/``env`` are the
        first run's. See ``cwsandbox_async._shell``. Nothing is sent before the first run."""
        from ._shell import Shell

        return Shell(self, cwd=cwd, env=env, timeout_seconds=timeout_seconds, max_output_bytes=max_output_bytes)

    # -- files -----------------------------------------------------------------
    async def read_file(
        self, path: str, *, timeout_seconds: float | None = None, max_bytes: int = MAX_FILE_BYTES
    ) -> bytes:
        """Return a file's bytes. ``SandboxFileError`` if it is missing, a directory or larger than
        ``max_bytes``; ``SandboxTimeoutError`` (infrastructure) past ``timeout_seconds``."""
        p = validate_path(path)
        limit = validate_count(max_bytes, "max_bytes")
        timeout = validate_timeout(timeout_seconds, default=self._defaults.operation_timeout_seconds)
        self._check_running()
        with backend_call("read_file", timeout, sandbox_id=self._id):
            data = await self._backend.read_file(self._id, p, limit)
        return data

    async def write_file(self, path: str, data: bytes | str, *, timeout_seconds: float | None = None) -> None:
        """Create or replace a file (parents are created). A str is written as UTF-8. ``SandboxFileError``
        where it may not be written; ``SandboxTimeoutError`` (infrastructure) past ``timeout_seconds``."""
        p = validate_path(path)
        payload = validate_file_data(data, p)
        timeout = validate_timeout(timeout_seconds, default=self._defaults.operation_timeout_seconds)
        self._check_running()
        with backend_call("write_file", timeout, sandbox_id=self._id):
            await self._backend.write_file(self._id, p, payload)

    async def upload(self, local_dir: str | Path, remote_dir: str, **limits: Any) -> Transfer:
        """Copy the directory ``local_dir`` (its contents) into ``remote_dir`` (made if missing) as one archive
        stream; a ``Transfer`` says what moved and what was left out (devices, FIFOs, symlinks leading out).
        Traversal-safe on the sandbox's side, which trusts nothing it receives (``_archive``).
        ``limits``: ``max_bytes`` of file data (256 MiB), ``max_members`` (100,000), ``timeout_seconds``
        (``operation_timeout_seconds``). ``SandboxValidationError`` for a local tree it cannot read or that is
        over a limit; ``SandboxFileError`` when the sandbox refuses the target (a file or a symlink in the way)."""
        from ._transfer import upload

        return await upload(self, local_dir, remote_dir, **limits)

    async def download(self, remote_dir: str, local_dir: str | Path, **limits: Any) -> Transfer:
        """Copy the directory ``remote_dir`` (its contents) into ``local_dir`` (made if missing) as one archive
        stream, which the host unpacks trusting nothing in it: no path outside ``local_dir``, no symlink
        followed (one already there included), no device, FIFO or hard link made, no setuid bit, only
        symlinks that stay inside. ``limits`` as for ``upload``. ``SandboxFileError`` for a remote tree that
        is missing or over a limit, or an archive the host refuses (what came before it stays written)."""
        from ._transfer import download

        return await download(self, remote_dir, local_dir, **limits)

    async def set_lifetime(self, seconds: float | None, *, timeout_seconds: float | None = None) -> None:
        """End the sandbox's life ``seconds`` from now even if this process dies (``Backend.set_lifetime``;
        None: the backend's default). A no-op where sandboxes die with their driver (local).

        Raises the backend's ``SandboxError`` if the lifetime cannot be set (``SandboxValidationError``
        where a backend can only shorten it), ``SandboxTerminatedError`` after ``stop()``, and
        ``SandboxTimeoutError`` (infrastructure) past ``timeout_seconds`` (default
        ``operation_timeout_seconds``)."""
        lifetime = validate_timeout(seconds, "seconds", allow_none=True)
        timeout = validate_timeout(timeout_seconds, default=self._defaults.operation_timeout_seconds)
        self._check_running()
        with backend_call("set_lifetime", timeout, sandbox_id=self._id):
            await self._backend.set_lifetime(self._id, lifetime)

    # -- lifecycle -------------------------------------------------------------
    async def stop(self) -> None:
        """Stop the sandbox and release it. Idempotent.

        Runs shielded from the caller's cancellation, within ``timeouts.stop_seconds``
        and the session's close budget. A destroy that fails or runs out of time is
        logged and raised (``SandboxError``); the sandbox counts as stopped either way
        (a sweep finds what a failed destroy left).
        """
        backend, sid = self._backend, self._id
        with self._budget.shielded():
            async with self._stop_lock:
                if self._status is SandboxStatus.COMPLETED:
                    return
                self._status = SandboxStatus.TERMINATING
                try:
                    await destroy(backend, sid, seconds=self._timeouts.stop_seconds, budget=self._budget)
                finally:
                    self._status = SandboxStatus.COMPLETED
                    lifetime = time.monotonic() - self._started
                    self._metrics.sandbox_destroyed(sid, lifetime)
                    log.debug("sandbox destroyed", sandbox_id=sid, lifetime_seconds=round(lifetime, 3))
                    if self._on_stopped is not None:
                        self._on_stopped(self)

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.stop()
        except SandboxError:
            if exc is None:
                raise

    def __repr__(self) -> str:
        return f"<Sandbox {self._id} {self._status.value} backend={self._backend.name}>"


class SandboxOpener:
    """``await session.sandbox()`` gives a Sandbox; ``async with session.sandbox()`` stops it on exit."""

    __slots__ = ("_create", "_sandbox")

    def __init__(self, create: Callable[[], Awaitable[Sandbox]]) -> None:
        self._create = create
        self._sandbox: Sandbox | None = None

    def __await__(self) -> Generator[Any, None, Sandbox]:
        return self._create().__await__()

    async def __aenter__(self) -> Sandbox:
        self._sandbox = await self._create()
        return self._sandbox

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._sandbox is not None
        await self._sandbox.__aexit__(exc_type, exc, tb)
