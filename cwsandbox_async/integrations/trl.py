"""Reward functions for TRL's ``GRPOTrainer`` that score completions by running them in sandboxes.

``trl`` is never imported. TRL calls a reward function as
``f(prompts=..., completions=..., completion_ids=..., **reward_kwargs)`` where
``reward_kwargs`` holds every other dataset column (one value per completion),
``trainer_state``, ``log_metric`` and ``log_extra``; both forms here accept that.

Per completion: the code is taken from ``<answer>...</answer>`` or a
```` ```python ```` fence (or your ``extractor``), and runs in a fresh sandbox
followed by the dataset column named by ``tests_column`` (a str or list of str,
e.g. MBPP's ``test_list``), under a harness that checks the tests ran to their
end (``_split``: the tests run in their own process, which the program cannot
reach, and call the program's functions across a pipe with plain data; ending
the process early, even with exit code 0, is a failure; tests signal failure by
raising, e.g. ``assert``). The reward is

- ``1.0`` if the program and its tests ran to their end and exited 0;
- ``0.0`` if they failed, ended the process early, ran past ``timeout_seconds``,
  were killed for their memory (OOM) or took their own sandbox down;
- ``None`` if the completion has no code, or if no verdict could be reached
  because the platform failed (``outcome.infra_failure``: a sandbox died for
  outside reasons, the backend broke, the program was starved of CPU by others
  on its first run and on every retry, the lease or item deadline passed). TRL turns ``None`` into NaN, "not
  applicable", so a broken sandbox is never read as a wrong answer.

A caller mistake or a bug (an unexpected exception) is raised after the batch
finished, never turned into a score. See ``docs/outcomes.md``.

Each call prints ``[CWSandbox] Reward call N (<name>): X sandboxes, Y/X passed, Z
skipped (no code)`` (plus infra failures, starved and OOM counts when there are
any; ``verbose=False`` silences it) and passes ``cwsandbox/<name>/*`` values
(pass_rate, no_code_fraction, infra_failures, starved, starved_retried, timeouts,
oom_killed) to TRL's ``log_metric``, which TRL logs as ``train/cwsandbox/<name>/*``.
When TRL passes ``trainer_state``, it also flushes the session's
sandbox metrics (``Session.log_metrics``; to W&B when a run is active or ``run=``
is given) as ``cwsandbox/<name>/*`` at ``cwsandbox/step`` = ``global_step + 1``:
the ``train/global_step`` TRL logs the same rewards at. The ``name`` keeps two
rewards in one trainer apart. Reward calls during evaluation fold into the next
training step's flush.

Use ``code_reward(...)`` (async; TRL runs it on its own persistent event loop
thread, and the Session and pool are created lazily on the first call in that
loop and kept) or ``code_reward_sync(...)`` (for callers without a loop: one
persistent loop thread owns the Session and pool; never ``asyncio.run`` per call).
Both close at interpreter exit; call ``aclose()`` / ``close()`` to close earlier.

Every completion gets a ``CompletionVerdict`` (its index, kind: passed, wrong_answer,
error_exit, early_exit, timeout, cpu_budget, oom, no_code, starved, infrastructure;
score, exit code, wall and CPU seconds, stderr tail): ``last_verdicts`` after each
call, ``on_verdicts=`` as a callback, a DEBUG log line each, and their kinds
counted in the printed line. A starved timeout is re-run (``starved_retries``)
before it is left unscored.

``code_reward`` returns a plain ``async def`` function (carrying ``aclose``,
``close``, ``calls``, ``last_stats``, ``last_verdicts`` and ``handle`` as attributes), not an object
with an async ``__call__``: TRL before 1.14 detects async rewards with
``inspect.iscoroutinefunction``, which is False for such an object, and would
iterate the coroutine instead of awaiting it. Every TRL from 1.0 on awaits a
function.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import functools
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast

import anyio

from .._errors import SandboxError, SandboxValidationError
from .._log import log
from .._session import Session
from .._tasks import HostedTaskGroup
from .._types import SandboxDefaults
from ..backends import BACKENDS
from ..judge._reward import JudgeOptions
from ._bridge import HOST_CLOSE_TIMEOUT_SECONDS, LoopThread, SessionHost, start_detached
from ._extract import completion_text, extract_code
from ._reward import Extractor, RewardCallStats, RewardCore, SandboxSource, VerdictCallback
from ._verdicts import CompletionVerdict, VerdictKind

if TYPE_CHECKING:
    from .._sandbox import Sandbox

__all__ = [
    "AsyncCodeReward",
    "CodeReward",
    "CompletionVerdict",
    "Extractor",
    "RewardCallStats",
    "RewardSettings",
    "SyncCodeReward",
    "VerdictCallback",
    "VerdictKind",
    "code_reward",
    "code_reward_sync",
    "completion_text",
    "extract_code",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardSettings:
    """Every setting of ``code_reward`` / ``code_reward_sync``: the one definition of their arguments.

    - ``name``: what TRL logs (``rewards/<name>/mean``), the printed line's label and the
      namespace of its metrics (``cwsandbox/<name>/*``); an identifier.
    - ``extractor``: text to code (default: ``<answer>`` tags, then a python fence).
    - ``tests_column``: the dataset column with each row's tests.
    - ``timeout_seconds``: per program; ``limit``: programs at once.
    - ``pool_size``: sandboxes kept warm (``0``: a new sandbox per program, no pool), up to
      ``pool_max_size`` (default ``max(pool_size, limit)``); a lease waits at most
      ``lease_timeout_seconds``.
    - ``python``: the interpreter the harness runs under; ``verbose``: print one line per call.
    - ``harness``: ``"split"`` (default: the tests run in a process the program cannot reach and call
      it across a pipe with plain data) or ``"in_process"`` (tests that must look inside the
      program's module; see docs/outcomes.md for what each leaves open).
    - ``starved_retries``: how many times a timeout classed as starved is re-run (default 1), each
      with ``timeout_seconds`` of CPU time within ``starved_retry_timeout_seconds`` of wall time
      (default 4 x ``timeout_seconds``), before the item is left unscored.
    - ``on_verdicts``: called after each call with every completion's ``CompletionVerdict``;
      ``verdict_table``: log the N worst verdicts of each call as a W&B table (0: off).
    - ``judge``: a ``JudgeOptions`` to judge each completion against its row's test cases
      (stdin/stdout or call-based; APPS/TACO, CodeContests, LiveCodeBench columns, or the
      ``tests_column``), in the language of ``judge.language_column``, the fence, or
      ``judge.language``; the reward is the judge's score (``docs/judge.md``).
    - ``defaults``, ``backend``, ``backend_options``, ``report_to``, ``run``: for the ``Session``.

    Bad settings raise ``SandboxValidationError`` when the reward is made, not mid-training.
    """

    name: str = "sandbox_reward"
    extractor: Extractor | None = None
    tests_column: str | None = None
    timeout_seconds: float = 10.0
    limit: int = 32
    pool_size: int = 8
    pool_max_size: int | None = None
    lease_timeout_seconds: float = 60.0
    python: str = "python3"
    verbose: bool = True
    harness: str = "split"
    starved_retries: int = 1
    starved_retry_timeout_seconds: float | None = None
    on_verdicts: VerdictCallback | None = None
    verdict_table: int = 0
    defaults: SandboxDefaults | Mapping[str, Any] | None = None
    backend: Any = "local"
    backend_options: Mapping[str, Any] | None = None
    report_to: Sequence[str] | None = None
    run: Any = None
    judge: JudgeOptions | None = None


P = ParamSpec("P")
R = TypeVar("R")


def _takes(settings: Callable[P, RewardSettings]) -> Callable[[Callable[[RewardSettings], R]], Callable[P, R]]:
    """Give a factory of ``RewardSettings -> R`` the keyword arguments of ``RewardSettings`` itself.

    The factory's face is derived, not written out: mypy checks its callers against the
    dataclass's fields, and ``help()`` / ``inspect.signature`` show them with their defaults.
    """

    def face(make: Callable[[RewardSettings], R]) -> Callable[P, R]:
        @functools.wraps(make)
        def factory(*args: P.args, **kwargs: P.kwargs) -> R:
            return make(settings(*args, **kwargs))

        params = list(inspect.signature(RewardSettings).parameters.values())
        factory.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # read by inspect/help
            params, return_annotation=inspect.signature(make).return_annotation
        )
        return factory

    return face


class _Base:
    """Settings shared by both forms; builds the session host."""

    def __init__(self, settings: RewardSettings) -> None:
        s = settings
        if not isinstance(s.name, str) or not s.name.isidentifier():
            raise SandboxValidationError(f"name must be an identifier (TRL logs rewards/<name>/mean), got {s.name!r}")
        if isinstance(s.pool_size, bool) or not isinstance(s.pool_size, int) or s.pool_size < 0:
            raise SandboxValidationError(f"pool_size must be an int >= 0, got {s.pool_size!r}")
        self.__name__ = s.name
        self.settings = settings
        self._core = RewardCore(
            extractor=s.extractor,
            tests_column=s.tests_column,
            timeout_seconds=s.timeout_seconds,
            limit=s.limit,
            lease_timeout_seconds=s.lease_timeout_seconds,
            python=s.python,
            verbose=s.verbose,
            name=s.name,
            harness=s.harness,
            starved_retries=s.starved_retries,
            starved_retry_timeout_seconds=s.starved_retry_timeout_seconds,
            on_verdicts=s.on_verdicts,
            verdict_table=s.verdict_table,
            run=s.run,
            judge=s.judge,
        )
        self._pool_size = s.pool_size
        self._pool_max_size = s.pool_max_size if s.pool_max_size is not None else max(s.pool_size, s.limit)
        self._session_args: dict[str, Any] = {
            "defaults": s.defaults,
            "backend": s.backend,
            "backend_options": s.backend_options,
            "report_to": s.report_to,
            "run": s.run,
            "metrics_namespace": s.name,  # two rewards in one trainer never write the same keys
            "handle_signals": False,  # the trainer owns the process's signals
        }
        if isinstance(s.backend, str) and s.backend not in BACKENDS:
            raise SandboxValidationError(f"unknown backend {s.backend!r}; choose one of {', '.join(sorted(BACKENDS))}")
        Session(**self._session_args)  # validate now, not on the first training step

    @property
    def calls(self) -> int:
        """How many times the function was called."""
        return self._core.calls

    @property
    def last_stats(self) -> RewardCallStats | None:
        """What the last call did (None before the first)."""
        return self._core.last_stats

    @property
    def last_verdicts(self) -> list[CompletionVerdict]:
        """The last call's ``CompletionVerdict`` per completion, in order (empty before the first)."""
        return self._core.last_verdicts

    def _new_host(self) -> SessionHost:
        return SessionHost(
            lambda: Session(**self._session_args), pool_size=self._pool_size, pool_max_size=self._pool_max_size
        )

    def _source(self, host: SessionHost) -> SandboxSource:
        lease_timeout = self._core.lease_timeout_seconds

        def source() -> AbstractAsyncContextManager[Sandbox]:
            if host.pool is not None:
                cm: AbstractAsyncContextManager[Sandbox] = host.pool.lease(timeout_seconds=lease_timeout)
                return cm
            if host.session is None:
                raise SandboxError("the reward function's session is closed", infrastructure=False)
            return host.session.sandbox()

        return source


class AsyncCodeReward(Protocol):
    """What ``code_reward`` returns: an ``async def`` function with a few attributes.

    ``calls``, ``last_stats`` and ``last_verdicts`` are refreshed when each call returns (or fails);
    ``handle`` is the ``CodeReward`` behind the function (its session and settings).
    """

    __name__: str
    calls: int
    last_stats: RewardCallStats | None
    last_verdicts: list[CompletionVerdict]
    handle: CodeReward

    async def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float | None]: ...

    #: Close the session (stopping every sandbox) on the function's loop. Idempotent.
    aclose: Callable[[], Awaitable[None]]
    #: Close from another thread (or atexit); ``close(timeout_seconds)``.
    close: Callable[..., None]


class CodeReward(_Base):
    """The state behind ``code_reward``'s function (see the module docstring); ``as_function()`` makes one.

    Bound to the event loop of its first call: the Session and pool live in a task
    on that loop until ``aclose()`` or interpreter exit. Calling it from another
    loop raises ``SandboxError`` (create one per loop, or ``aclose()`` first).
    """

    def __init__(self, settings: RewardSettings) -> None:
        super().__init__(settings)
        self._host: SessionHost | None = None
        #: The task group the session host runs in (opened at the first call), and the host's end.
        self._tasks: HostedTaskGroup | None = None
        self._ended: anyio.Event | None = None
        self._ready: asyncio.Future[SessionHost] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._atexit = False

    async def _ensure_host(self) -> SessionHost:
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            raise SandboxError(
                "this reward function is bound to the event loop of its first call; "
                "create one per loop or call aclose() first",
                infrastructure=False,  # the caller's mistake
            )
        ready = self._ready
        if ready is None or (ready.done() and (ready.cancelled() or ready.exception() is not None)):
            self._loop = loop
            self._host = self._new_host()
            if self._tasks is None:
                self._tasks = HostedTaskGroup("cwsandbox-reward-tasks")
            self._ended, ready = await start_detached(self._host, self._tasks)
            self._ready = ready
            if not self._atexit:
                ref = weakref.ref(self)
                atexit.register(_close_at_exit, ref)
                self._atexit = True
        return await asyncio.shield(ready)

    async def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float | None]:
        """Score ``completions``; returns one ``1.0``/``0.0``/``None`` per completion, in order."""
        if completions is None:
            raise SandboxValidationError("completions= is required")
        host = await self._ensure_host()
        return await self._core.score(self._source(host), host.session, completions, kwargs)

    def as_function(self) -> AsyncCodeReward:
        """A plain ``async def`` reward function that scores through this object (what TRL is given)."""
        handle = self

        async def reward(
            prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any
        ) -> list[float | None]:
            try:
                return await handle(prompts, completions, **kwargs)
            finally:
                fn.calls, fn.last_stats, fn.last_verdicts = handle.calls, handle.last_stats, handle.last_verdicts

        reward.__name__ = reward.__qualname__ = self.__name__
        reward.__doc__ = f"Sandbox reward {self.__name__!r}: 1.0 passed, 0.0 failed, None no code / infra failure."
        # A function object takes attributes; the Protocol says which (mypy cannot see them set).
        fn = cast(AsyncCodeReward, reward)
        fn.handle = self
        fn.calls, fn.last_stats, fn.last_verdicts = self.calls, self.last_stats, self.last_verdicts
        fn.aclose = self.aclose
        fn.close = self.close
        return fn

    async def aclose(self) -> None:
        """Close the session (stopping every sandbox) on this loop. Idempotent."""
        host, ended, tasks = self._host, self._ended, self._tasks
        self._host, self._ended, self._tasks, self._ready, self._loop = None, None, None, None, None
        if tasks is None:
            return
        try:
            if host is not None and ended is not None:
                host.stop()
                with anyio.fail_after(HOST_CLOSE_TIMEOUT_SECONDS):
                    await ended.wait()
        finally:
            await tasks.aclose()

    def close(self, timeout_seconds: float = HOST_CLOSE_TIMEOUT_SECONDS) -> None:
        """Close from outside the loop (another thread, or atexit). A no-op if the loop has stopped."""
        loop, ended = self._loop, self._ended
        if loop is None or ended is None or ended.is_set():
            return  # never opened, already closed, or its loop ended (asyncio.run cancels it, closing the session)
        if loop.is_closed() or not loop.is_running():
            log.warning("reward function's loop is not running; its session cannot be closed cleanly")
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise SandboxError(
                "close() would block the loop it needs; use 'await reward.aclose()'", infrastructure=False
            )
        try:
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout_seconds)
        except Exception as exc:
            log.warning("closing the reward function's session failed", error=repr(exc))


class SyncCodeReward(_Base):
    """Sync reward function (see the module docstring). Create it with ``code_reward_sync``.

    The first call starts one daemon thread with a persistent event loop that owns
    the Session and pool; every call runs there. Thread-safe. ``close()`` (or
    interpreter exit) stops every sandbox and the thread.
    """

    def __init__(self, settings: RewardSettings) -> None:
        super().__init__(settings)
        self._bridge: LoopThread | None = None
        self._lock = threading.Lock()

    def _ensure_bridge(self) -> LoopThread:
        with self._lock:
            if self._bridge is None or self._bridge.closed:
                self._bridge = LoopThread(self._new_host(), name=f"cwsandbox-{self.__name__}")
            return self._bridge

    def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float | None]:
        """Score ``completions``; blocks until done. Must not be called from the bridge's own loop."""
        if completions is None:
            raise SandboxValidationError("completions= is required")
        bridge = self._ensure_bridge()
        host = bridge.host

        async def run() -> list[float | None]:
            return await self._core.score(self._source(host), host.session, completions, kwargs)

        return bridge.call(run)

    def close(self) -> None:
        """Stop every sandbox and the loop thread. Idempotent; a later call starts a new one."""
        with self._lock:
            bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.close()


def _close_at_exit(ref: weakref.ref[CodeReward]) -> None:
    reward = ref()
    if reward is not None:
        reward.close()


@_takes(RewardSettings)
def code_reward(settings: RewardSettings) -> AsyncCodeReward:
    """An async TRL reward function (a plain ``async def``) that runs each completion's code in a sandbox.

    Takes ``RewardSettings``' fields as keyword arguments (``name``, ``tests_column``,
    ``timeout_seconds``, ``limit``, ``pool_size``, ...; see that class). Bad settings raise
    ``SandboxValidationError`` here, not mid-training. The function has ``aclose()`` (on
    its loop), ``close()`` (from another thread), ``calls``, ``last_stats`` and ``handle``
    (see ``AsyncCodeReward``).
    """
    return CodeReward(settings).as_function()


@_takes(RewardSettings)
def code_reward_sync(settings: RewardSettings) -> SyncCodeReward:
    """The sync form of ``code_reward`` (same arguments), for callers without an event loop."""
    return SyncCodeReward(settings)
