"""Session: the one owner of sandboxes, pools and metrics. Everything it made is stopped on exit."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import contextvars
import enum
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from anyio.abc import TaskGroup

from ._budget import CloseBudget
from ._deadline import backend_call, destroy
from ._errors import SandboxBackendUnavailableError, SandboxError, SandboxValidationError
from ._log import log
from ._sandbox import Sandbox, SandboxOpener
from ._sdk import STATUS_ALIASES
from ._settings import Timeouts
from ._signals import SigtermReceiver, sigterm_cancels
from ._tasks import HostedTaskGroup
from ._types import SandboxDefaults, SandboxInfo, SandboxSpec, SandboxStatus
from ._validate import validate_sweep, validate_tags
from .backends import load_backend
from .metrics._aggregator import MetricsAggregator
from .metrics._reporting import MetricsReporting
from .metrics._snapshot import MetricsSnapshot

if TYPE_CHECKING:
    from .backends.base import Backend
    from .reporters import Reporter

__all__ = ["Session", "SessionState"]

#: What ``Session.add_closer`` takes: an async callable run at close, before sandboxes are stopped.
Closer = Callable[[], Awaitable[None]]


class SessionState(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Session:
    """Owns a backend, the sandboxes created through it, their pools and metrics.

    ``async with Session(defaults, backend="local") as session:``. Leaving the block
    (return, exception, cancellation, SIGINT, SIGTERM) closes its pools and stops
    every sandbox the session created, concurrently, shielded from cancellation,
    within ``timeouts.close_seconds`` in all: every shielded step below goes through
    the session's ``CloseBudget`` (``_budget``). A stop that fails or runs out of time
    is logged, never raised from the close. The session opens one task group (around
    the ``async with`` block; see ``start_background``) where pools run their
    background work. ``backend`` is a name (``"local"``, ``"kubernetes"``,
    ``"coreweave"``, ``"fake"``) or a ``Backend`` instance; ``backend_options`` go
    to its constructor; ``timeouts`` are the client-side timeouts and budgets
    (``Timeouts``). With ``handle_signals`` (the default), SIGTERM cancels the
    ``async with`` body, the session closes, and the process then dies of SIGTERM
    (``_signals``); a session opened with ``open()`` instead handles no signal.
    ``report_to``/``run`` choose where ``log_metrics`` sends the metrics;
    ``metrics_namespace="x"`` names them ``cwsandbox/x/*`` (the step stays
    ``cwsandbox/step``), so several sessions can share one W&B run.
    """

    def __init__(
        self,
        defaults: SandboxDefaults | Mapping[str, Any] | None = None,
        *,
        backend: str | Backend = "local",
        backend_options: Mapping[str, Any] | None = None,
        report_to: str | Sequence[str | Reporter] | None = None,
        run: Any = None,
        handle_signals: bool = True,
        timeouts: Timeouts | None = None,
        metrics_namespace: str | None = None,
    ) -> None:
        if defaults is None:
            defaults = SandboxDefaults()
        elif isinstance(defaults, Mapping):
            defaults = SandboxDefaults().with_overrides(**defaults)
        elif not isinstance(defaults, SandboxDefaults):
            raise SandboxValidationError("defaults must be a SandboxDefaults or a mapping")
        if timeouts is not None and not isinstance(timeouts, Timeouts):
            raise SandboxValidationError("timeouts must be a Timeouts")
        self.defaults: SandboxDefaults = defaults
        #: The client-side timeouts and budgets (``Timeouts``).
        self.timeouts: Timeouts = timeouts or Timeouts()
        #: The one budget of this session's close: pools and sandboxes run their cleanup under it.
        self.close_budget = CloseBudget()
        self.session_id = uuid.uuid4().hex[:12]
        self._backend_spec = backend
        self._backend_options = dict(backend_options or {})
        self._backend: Backend | None = None
        self._state = SessionState.NEW
        self._sandboxes: dict[str, Sandbox] = {}
        self._creating: set[str] = set()
        self._closers: list[Closer] = []  # pools and other things closed before sandboxes
        self._handle_signals = handle_signals
        self._body: anyio.CancelScope | None = None
        self._task_group: TaskGroup | None = None  # the ``async with`` block's; else ``_hosted``'s
        self._hosted: HostedTaskGroup | None = None
        self._lifetime_cm: contextlib.AbstractAsyncContextManager[Session] | None = None
        self._ctx_token: Mapping[str, contextvars.Token[Any]] | None = None
        self.metrics = MetricsAggregator()
        self._report_to = report_to
        self._run = run
        self._reporting = MetricsReporting.from_options(self.metrics, report_to, run, metrics_namespace)

    # -- lifecycle -------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise SandboxError("session is not open; use 'async with Session(...)'", infrastructure=False)
        return self._backend

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def is_open(self) -> bool:
        """Whether the session is open (sandboxes may be created)."""
        return self._state is SessionState.OPEN

    @property
    def sandboxes(self) -> list[Sandbox]:
        """Sandboxes this session created and has not stopped yet."""
        return list(self._sandboxes.values())

    async def open(self) -> Session:
        """Open the backend. Prefer ``async with``, which also closes and handles SIGTERM.

        ``SandboxValidationError`` when not on asyncio (under trio, say) and the backend needs it: every
        backend the library ships does but the fake (``Backend.asyncio_only``)."""
        if self._state is not SessionState.NEW:
            raise SandboxError(f"session is {self._state.value}; a session can be opened once", infrastructure=False)
        backend = load_backend(self._backend_spec, **self._backend_options)
        if getattr(backend, "asyncio_only", True) and not _on_asyncio():  # (a constructor starts nothing)
            raise SandboxValidationError(
                f"the {backend.name} backend runs only on asyncio's event loop: use asyncio.run(main()) or "
                "anyio.run(main) (not backend='trio')"
            )
        self._backend = backend
        self._state = SessionState.OPEN
        self._ctx_token = structlog.contextvars.bind_contextvars(session_id=self.session_id)
        log.debug("session opened", backend=self._backend.name, isolation=self._backend.isolation)
        return self

    @contextlib.asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[Session]:
        """The ``async with`` block: open, run the body in a scope SIGTERM cancels, inside the session's task
        group (pools run their background work there), always close."""
        await self.open()
        body_exc: BaseException | None = None
        receiver: SigtermReceiver | None = None
        try:
            with contextlib.ExitStack() as stack:
                if self._handle_signals:
                    receiver = stack.enter_context(sigterm_cancels(self._on_sigterm))
                async with anyio.create_task_group() as tg:
                    self._task_group = tg
                    try:
                        with anyio.CancelScope() as self._body:
                            yield self
                    except BaseException as exc:  # kept out of the task group, which would wrap it in a group
                        body_exc = exc
                    finally:
                        self._body = None
                        await self.aclose()  # still under the handler: a second SIGTERM cannot cut it short
                        tg.cancel_scope.cancel()  # closed: what is left of the background work ends now
        finally:
            self._task_group = None
            if receiver is not None:
                receiver.die_if_received()  # the handler is gone: the process dies of the SIGTERM
        if body_exc is not None:
            raise body_exc

    def _on_sigterm(self) -> None:
        if self._body is not None:
            self._body.cancel()

    async def __aenter__(self) -> Session:
        if self._lifetime_cm is not None:
            raise SandboxError("a session can be entered once", infrastructure=False)
        self._lifetime_cm = self._lifetime()
        return await self._lifetime_cm.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._lifetime_cm is not None
        return await self._lifetime_cm.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close pools, stop every sandbox, close the backend, within ``timeouts.close_seconds``.

        Idempotent. Shielded from the caller's cancellation and never raises for a
        failed or abandoned stop (each is logged); the reporters get the last flush.
        """
        if self._state in (SessionState.CLOSING, SessionState.CLOSED):
            return
        if self._state is SessionState.NEW:
            self._state = SessionState.CLOSED
            return
        self._state = SessionState.CLOSING
        with self.close_budget.closing(self.timeouts.close_seconds) as scope:
            for closer in reversed(self._closers):
                await _quietly("closing a pool", closer)
            await self._stop_all()
            await _quietly("closing the backend", self.backend.aclose)
            if self._hosted is not None:  # opened with open(): its task group ends here
                await self._hosted.aclose()
        if scope.cancelled_caught:
            log.warning(
                "session close hit its deadline",
                close_seconds=self.timeouts.close_seconds,
                remaining=len(self._sandboxes) + len(self._creating),
            )
        self._reporting.close()  # after the stops, so their counts are in it; never raises
        self._state = SessionState.CLOSED
        if self._ctx_token is not None:
            # Closed from another task than the one that opened it: the tokens belong to that
            # task's context and cannot be reset here; that context ends with its task anyway.
            with contextlib.suppress(ValueError):
                structlog.contextvars.reset_contextvars(**self._ctx_token)
            self._ctx_token = None
        log.debug("session closed")

    async def _stop_all(self) -> None:
        limiter = anyio.CapacityLimiter(self.timeouts.close_concurrency)

        async def stop_one(sb: Sandbox) -> None:
            async with limiter:
                await _quietly("stopping a sandbox", sb.stop, logged=True)

        async def destroy_id(sandbox_id: str) -> None:
            async with limiter:
                await _quietly("destroying a sandbox", lambda: self._destroy_quietly(sandbox_id), logged=True)

        async with anyio.create_task_group() as tg:
            for sb in list(self._sandboxes.values()):
                tg.start_soon(stop_one, sb)
            for sid in list(self._creating):
                tg.start_soon(destroy_id, sid)

    def _check_open(self) -> None:
        if self._state is not SessionState.OPEN:
            raise SandboxError(
                f"session is {self._state.value}; it must be open (use 'async with')", infrastructure=False
            )

    def add_closer(self, closer: Closer) -> None:
        """Register an async callable run at close, before sandboxes are stopped (pools use this).

        It runs under the session's close budget (``close_budget``): its own shielded
        steps must go through ``close_budget.shielded``. Whatever it raises is logged
        (a ``SandboxError`` as a warning, anything else, a bug, at ERROR) and the close
        goes on: a close must release everything, so nothing a closer raises escapes it.
        """
        self._closers.append(closer)

    def remove_closer(self, closer: Closer) -> None:
        if closer in self._closers:
            self._closers.remove(closer)

    async def start_background(
        self, host: Callable[..., Coroutine[Any, Any, Any]], name: str, *, closer: Closer
    ) -> None:
        """Start ``host`` in the session's task group and run ``closer`` at close, before sandboxes are stopped
        (pools host their background work here).

        ``host`` takes ``task_status`` and reports readiness as ``TaskGroup.start`` wants; this returns once
        it has. The group is the ``async with`` block's; a session opened with ``open()`` hosts one in a
        task of its own (``_tasks.HostedTaskGroup``), ended by ``aclose``. What ``host`` raises before it
        is ready propagates; raises ``SandboxError`` if the session is not open."""
        self._check_open()
        tg = self._task_group
        if tg is None:
            if self._hosted is None:
                self._hosted = HostedTaskGroup(f"cwsandbox session {self.session_id}")
            tg = await self._hosted.open()
        self._closers.append(closer)
        try:
            await tg.start(host, name=name)
        except BaseException:
            self.remove_closer(closer)
            raise

    # -- sandboxes -------------------------------------------------------------
    def sandbox(self, **overrides: Any) -> SandboxOpener:
        """Create a sandbox: ``sb = await session.sandbox()`` or ``async with session.sandbox() as sb``.

        ``overrides`` are ``SandboxDefaults`` fields for this sandbox (tags and env merge).
        Raises ``SandboxCreationError`` if it fails to start, ``SandboxTimeoutError`` if it
        is not ready within ``create_timeout_seconds``.
        """
        defaults = self.defaults.with_overrides(**overrides) if overrides else self.defaults
        return SandboxOpener(lambda: self.create_sandbox(defaults))

    async def create_sandbox(self, defaults: SandboxDefaults | None = None) -> Sandbox:
        """Create one sandbox with ``defaults`` (the session's if None) and wait until it is ready."""
        self._check_open()
        defaults = defaults or self.defaults
        backend = self.backend
        sandbox_id = f"sbx-{uuid.uuid4().hex[:12]}"
        spec = SandboxSpec(sandbox_id=sandbox_id, session_id=self.session_id, defaults=defaults)
        self._creating.add(sandbox_id)
        start = time.monotonic()
        try:
            with backend_call("create", defaults.create_timeout_seconds, sandbox_id=sandbox_id):
                await backend.create(spec)
        except BaseException as exc:
            self._creating.discard(sandbox_id)
            if not isinstance(exc, SandboxValidationError):  # that one was refused before anything was made
                # shielded: a cancelled create leaves nothing behind; after a create that could not reach the
                # backend, a destroy that cannot either is no news (and the backend's close sweeps again)
                await self._destroy_quietly(sandbox_id, expected=isinstance(exc, SandboxBackendUnavailableError))
            if isinstance(exc, Exception):
                self.metrics.sandbox_create_failed(exc)
                log.info("sandbox create failed", sandbox_id=sandbox_id, error=repr(exc))
            raise
        self._creating.discard(sandbox_id)
        startup = time.monotonic() - start
        sb = self._handle(sandbox_id, defaults, startup)
        self._sandboxes[sandbox_id] = sb
        self.metrics.sandbox_created(sandbox_id, startup)
        log.debug("sandbox created", sandbox_id=sandbox_id, startup_seconds=round(startup, 4))
        if self._state is not SessionState.OPEN:  # closed while we were creating
            await sb.stop()
            raise SandboxError(  # the caller closed it: not the platform's failure
                "session closed while the sandbox was being created", sandbox_id=sandbox_id, infrastructure=False
            )
        return sb

    async def attach(self, sandbox_id: str, *, adopt: bool = False, timeout_seconds: float | None = None) -> Sandbox:
        """A handle to a sandbox another session or process created (locally: another process of this host
        user, or any user's for root; see ``Backend.attach``), as the CoreWeave SDK's ``Sandbox.from_id``.

        ``adopt=True`` makes this session its owner: it is stopped when the session closes (and its creator
        no longer stops it, where the backend can say so, as the local one can). Without it the session's
        close only lets go of it; ``sb.stop()`` stops it either way. Raises ``SandboxNotFoundError`` for an
        id this caller cannot reach (unknown, gone, another user's), ``SandboxNotSupportedError`` where the
        backend cannot attach, ``SandboxTimeoutError`` past ``timeout_seconds`` (default
        ``operation_timeout_seconds``)."""
        from ._attach import attach

        return await attach(self, sandbox_id, adopt=adopt, timeout_seconds=timeout_seconds)

    async def _destroy_quietly(self, sandbox_id: str, *, expected: bool = False) -> None:
        """Destroy a sandbox by id, shielded, within ``timeouts.stop_seconds`` and the close budget; log a failure
        (at INFO if ``expected``: the backend just said it cannot be reached)."""
        if expected:
            try:
                with backend_call(
                    "destroy", self.timeouts.stop_seconds, sandbox_id=sandbox_id, budget=self.close_budget
                ):
                    await self.backend.destroy(sandbox_id)
            except SandboxError as exc:
                log.info("no destroy after a create that could not reach the backend", error=repr(exc))
            return
        with contextlib.suppress(SandboxError):  # destroy() logged it
            await destroy(self.backend, sandbox_id, seconds=self.timeouts.stop_seconds, budget=self.close_budget)

    def _forget(self, sb: Sandbox) -> None:
        self._sandboxes.pop(sb.sandbox_id, None)

    def _handle(self, sandbox_id: str, defaults: SandboxDefaults, startup_seconds: float) -> Sandbox:
        """A handle to a running sandbox, wired to this session (metrics, timeouts, close budget, forget)."""
        return Sandbox(
            sandbox_id=sandbox_id,
            backend=self.backend,
            defaults=defaults,
            metrics=self.metrics,
            timeouts=self.timeouts,
            budget=self.close_budget,
            on_stopped=self._forget,
            startup_seconds=startup_seconds,
        )

    # -- list and sweep --------------------------------------------------------
    async def list(
        self,
        tags: Sequence[str] | None = None,
        *,
        status: SandboxStatus | str | Sequence[SandboxStatus | str] | None = None,
    ) -> builtins.list[SandboxInfo]:
        """Sandboxes on this backend carrying all of ``tags`` (default: the session's tags),
        including leftovers of other, possibly crashed, processes.

        ``status`` keeps only sandboxes in that status (or any of several), as the
        CoreWeave SDK's ``list(status=...)``; an unknown status raises ``SandboxValidationError``.
        """
        self._check_open()
        wanted = validate_tags(self.defaults.tags if tags is None else tags)
        keep = _statuses(status)
        with backend_call("list", self.defaults.operation_timeout_seconds):
            found = await self.backend.list(wanted)
        return found if keep is None else [info for info in found if info.status in keep]

    async def sweep(
        self, tags: Sequence[str] | None = None, *, older_than_seconds: float | None = None, include_own: bool = False
    ) -> builtins.list[str]:
        """Stop sandboxes carrying all of ``tags`` (default: the session's tags) that this session's backend
        did not create (or all, with ``include_own``), optionally only those older than
        ``older_than_seconds``. Returns their ids.

        Goes through ``Backend.sweep``: one ``deletecollection`` on Kubernetes and one
        ``PurgeSandboxes`` on CoreWeave where they select exactly the victims, a list and a
        destroy each elsewhere. Bounded by ``timeouts.sweep_seconds`` (``SandboxTimeoutError``,
        infrastructure, past it). ``SandboxValidationError`` without tags and without an age, so it
        cannot stop everything by accident. One by one, a sandbox that cannot be stopped is logged
        and left out of the result; a bulk delete that fails raises the backend's ``SandboxError``."""
        self._check_open()
        wanted, min_age = validate_sweep(self.defaults.tags if tags is None else tags, older_than_seconds)
        with backend_call("sweep", self.timeouts.sweep_seconds):
            victims = await self.backend.sweep(wanted, older_than_seconds=min_age, include_own=include_own)
        own = [self._sandboxes[sid] for sid in victims if sid in self._sandboxes]
        async with anyio.create_task_group() as tg:
            for sb in own:  # the backend destroyed them; stop() (idempotent) marks the handles stopped
                tg.start_soon(functools.partial(_quietly, "stopping a swept sandbox", sb.stop, logged=True))
        self.metrics.swept(len(victims))
        log.info("sweep", tags=list(wanted), swept=len(victims))
        return victims

    # -- metrics ---------------------------------------------------------------
    def log_metrics(self, step: int | None = None, *, reset: bool = True) -> bool:
        """Flush the metrics gathered since the last flush to every reporter, as training step ``step``.

        ``step=None`` means the last step + 1 (0 first). ``reset=False`` keeps
        accumulating after the flush. Returns True if every available reporter
        took the snapshot; False, keeping the data for the next flush, if there
        is no reporter (no W&B run yet: warned once), nothing happened since the
        last flush, or a reporter failed (logged as a warning). W&B gets
        ``cwsandbox/step``, never ``step=``. Closing the session flushes what is
        left as step last + 1, or, when it only stopped sandboxes, as step last's
        ``cwsandbox/teardown/*`` (no trailing row of zeros).
        Thread-safe (may be called off the event loop). Raises
        ``SandboxValidationError`` for a step that is not a non-negative int.
        """
        return self._reporting.log(step, reset=reset)

    def snapshot(self) -> MetricsSnapshot:
        """The metrics since the last flush, frozen (``.as_dict()`` gives the ``cwsandbox/*`` mapping)."""
        return self.metrics.snapshot()

    def get_metrics(self) -> dict[str, Any]:
        """The CoreWeave SDK's name: the metrics since the last flush as the ``cwsandbox/*`` mapping
        (``snapshot().as_dict()``); flushes and resets nothing."""
        return dict(self.snapshot().as_dict())


def _on_asyncio() -> bool:
    """Whether this thread runs an asyncio event loop (anyio's asyncio backend included; trio's is not one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _statuses(status: object) -> frozenset[SandboxStatus] | None:
    """``status`` of ``Session.list`` as a set (None: no filter); ``SandboxValidationError`` for an unknown one."""
    if status is None:
        return None
    items = [status] if isinstance(status, str) else status
    if not isinstance(items, Sequence | frozenset | set):
        raise SandboxValidationError(f"status must be a SandboxStatus, its name, or a list of them, got {status!r}")
    out = set()
    for item in items:
        name = str(item).lower()
        try:
            out.add(SandboxStatus(STATUS_ALIASES.get(name, name)))
        except ValueError:
            known = ", ".join(s.value for s in SandboxStatus)
            raise SandboxValidationError(f"unknown status {item!r}; one of {known}") from None
    return frozenset(out)


async def _quietly(what: str, step: Callable[[], Awaitable[None]], *, logged: bool = False) -> None:
    """One step of a close: a ``SandboxError`` is logged as a warning (unless ``logged`` already), any
    other exception (a bug) at ERROR, and the close goes on either way: it must release everything."""
    try:
        await step()
    except SandboxError as exc:
        if not logged:
            log.warning(f"{what} failed", error=repr(exc))
    except Exception as exc:  # a bug below: seen in the log at ERROR, and the close still completes
        log.error(f"{what} failed with a bug", error=repr(exc))
