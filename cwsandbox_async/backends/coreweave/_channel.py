"""One ``grpc.aio`` channel to the service: deadlines, retries, an in-flight cap, call counts.

Every RPC goes through ``Channel.unary`` or ``Channel.exchange`` (a bidirectional stream):

- a deadline on every attempt (``timeout=``; the service sees it as ``grpc-timeout``);
- at most ``max_in_flight`` calls open at once (an anyio semaphore; streams hold their
  slot until they end);
- retries with tenacity for what the service refused before doing anything
  (``UNAVAILABLE``; ``RESOURCE_EXHAUSTED`` when it sent a ``RetryInfo`` or a capacity
  reason), waiting the ``RetryInfo`` delay when given (capped at
  ``max_retry_delay_seconds``), otherwise jittered exponential backoff; at most
  ``max_retries`` re-sends. Calls that are not idempotent (exec) are re-sent only when
  the service itself refused them (``RpcFailure.refused_before_start``);
- ``calls`` counts every attempt per method, so tests and benchmarks can count API calls;
- ``unary_exec``: whether the service serves the unary ``Exec`` RPC (no known client calls
  it): ``None`` until it has been seen either way, ``True`` once an ``Exec`` was answered,
  ``False`` (logged once) once it answered ``UNIMPLEMENTED``. While it is unknown, one exec
  at a time asks (``probe_unary_exec``); the others of the same burst take ``StreamExec``.

``open_channel`` builds one; for TLS it reads the root certificates (grpc's bundled
``roots.pem``, or ``$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``) in a worker thread, off the loop.

Runs on the caller's event loop (no thread hop). Failures leave as ``RpcError``
carrying the parsed ``RpcFailure``; the backend translates them with the context it has.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import grpc
import grpc.aio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_random_exponential

from ..._log import log
from ._errors import RpcFailure
from ._options import AuthMetadata, CoreWeaveOptions, Endpoint

__all__ = ["Channel", "RpcError", "open_channel", "ssl_credentials"]

T = TypeVar("T")


class RpcError(Exception):
    """A call that ended with a non-OK status (internal: the backend translates it)."""

    def __init__(self, failure: RpcFailure, cause: grpc.aio.AioRpcError) -> None:
        super().__init__(failure.describe("rpc"))
        self.failure = failure
        self.cause = cause


def _parse(exc: grpc.aio.AioRpcError) -> RpcError:
    return RpcError(RpcFailure.parse(exc), exc)


async def _settled(call: Any) -> Any:
    """``await call`` for a unary grpc.aio call, cancellable the way anyio expects.

    grpc.aio turns a cancellation into a fresh ``CancelledError`` without the cancel
    scope's message, which anyio then cannot claim (``move_on_after`` would leak it).
    Waiting on a plain future that the call completes keeps the original cancellation;
    the call itself is cancelled on the way out.
    """
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    call.add_done_callback(wake)
    try:
        await waiter
    except asyncio.CancelledError:
        call.cancel()
        raise
    return await call  # done: returns or raises at once


async def _joined(task: asyncio.Task[T], call: Any) -> T:
    """Wait for ``task`` (the body of a stream call), cancellable the way anyio expects (see ``_settled``).

    One task per call, not one per read or write: each step of a stream costs a loop
    iteration already, and a task plus ``asyncio.wait`` per step doubled the client's CPU.
    """
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    try:
        await waiter
    except asyncio.CancelledError:
        task.cancel()
        call.cancel()
        task.add_done_callback(_consume)
        raise
    return task.result()


def _consume(task: asyncio.Task[Any]) -> None:
    """Retrieve a cancelled body's outcome, so asyncio never reports it as unretrieved."""
    if not task.cancelled():
        task.exception()


def ssl_credentials() -> grpc.ChannelCredentials:
    """TLS credentials with the root certificates read from disk (blocking: call it in a worker thread)."""
    path = os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH") or os.path.join(
        os.path.dirname(grpc.__file__), "_cython", "_credentials", "roots.pem"
    )
    try:
        with open(path, "rb") as f:
            roots: bytes | None = f.read()
    except OSError:
        roots = None  # grpc finds its own (it reads them itself, also off the loop: we are in a thread)
    return grpc.ssl_channel_credentials(root_certificates=roots)


async def open_channel(options: CoreWeaveOptions, endpoint: Endpoint, metadata: AuthMetadata) -> Channel:
    """A ``Channel`` to ``endpoint``; TLS material is loaded in a worker thread, never on the loop."""
    credentials = await anyio.to_thread.run_sync(ssl_credentials) if endpoint.secure else None
    return Channel(options, endpoint, metadata, credentials)


class Channel:
    """The backend's connection to the service (created on first use, on the running loop).

    ``credentials`` are the TLS credentials of a secure endpoint (see ``open_channel``)."""

    def __init__(
        self,
        options: CoreWeaveOptions,
        endpoint: Endpoint,
        metadata: AuthMetadata,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        from cwsandbox._proto import sandbox_pb2_grpc

        self.options = options
        self.endpoint = endpoint
        self.metadata = metadata
        self.calls: Counter[str] = Counter()
        self.unary_exec: bool | None = None
        self._probing = False
        self._one_ways: dict[str, Any] = {}
        channel_options = [
            ("grpc.max_send_message_length", options.max_message_bytes),
            ("grpc.max_receive_message_length", options.max_message_bytes),
            ("grpc.enable_retries", 0),  # retries are ours, counted and bounded
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
        ]
        if endpoint.secure:
            if credentials is None:
                raise ValueError("a secure endpoint needs credentials: build the channel with open_channel")
            self._channel = grpc.aio.secure_channel(endpoint.target, credentials, options=channel_options)
        else:
            self._channel = grpc.aio.insecure_channel(endpoint.target, options=channel_options)
        stub_class: Any = sandbox_pb2_grpc.SandboxServiceStub  # generated code, untyped
        self.stub = stub_class(self._channel)
        self._slots = anyio.Semaphore(options.max_in_flight, fast_acquire=True)  # no loop round trip when free

    def probe_unary_exec(self) -> bool:
        """Whether this exec may call unary ``Exec``: yes once the service was seen to serve it; while that
        is unknown, for one caller at a time (the probe; it reports with ``unary_exec_seen``), so a first
        burst of execs asks once, not once each; never once the service answered ``UNIMPLEMENTED``."""
        if self.unary_exec is not None:
            return self.unary_exec
        if self._probing:
            return False
        self._probing = True
        return True

    def unary_exec_seen(self, served: bool | None) -> None:
        """What an ``Exec`` call showed: served (an answer came), not served (``UNIMPLEMENTED``: every
        later exec uses ``StreamExec``, logged once), or ``None`` (nothing learned: the next exec asks again)."""
        self._probing = False
        if served is False and self.unary_exec is not False:
            self.unary_exec = False
            log.info("coreweave service does not serve unary Exec; using StreamExec", target=self.endpoint.target)
        elif served and self.unary_exec is None:
            self.unary_exec = True

    def retrying(self, idempotent: bool, what: str) -> AsyncRetrying:
        """The retry policy (see the module docstring) for a call named ``what``."""
        opts = self.options
        backoff = wait_random_exponential(multiplier=0.1, max=opts.max_retry_delay_seconds)

        def should_retry(exc: BaseException) -> bool:
            if not isinstance(exc, RpcError):
                return False
            failure = exc.failure
            return failure.retryable if idempotent else failure.refused_before_start

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            hint = exc.failure.retry_delay if isinstance(exc, RpcError) else None
            delay = min(hint, opts.max_retry_delay_seconds) if hint is not None else backoff(state)
            log.debug("coreweave retry", call=what, attempt=state.attempt_number, delay=round(delay, 3))
            return delay

        return AsyncRetrying(
            retry=retry_if_exception(should_retry),
            wait=wait,
            stop=stop_after_attempt(opts.max_retries + 1),
            sleep=anyio.sleep,
            reraise=True,
        )

    async def unary(self, method: str, request: Any, *, deadline: float | None = None, idempotent: bool = True) -> Any:
        """Call unary ``method`` (a stub attribute, e.g. ``"GetSandbox"``); raise ``RpcError`` on failure."""
        rpc = getattr(self.stub, method)
        seconds = self.options.request_timeout_seconds if deadline is None else deadline

        async def attempt() -> Any:
            self.calls[method] += 1
            async with self._slots:
                try:
                    return await _settled(rpc(request, timeout=seconds, metadata=self.metadata))
                except grpc.aio.AioRpcError as exc:
                    raise _parse(exc) from exc

        try:
            return await attempt()  # the common case, without building a retry loop
        except RpcError as exc:
            failure = exc.failure
            if not (failure.retryable if idempotent else failure.refused_before_start) or self.options.max_retries == 0:
                raise
            first: RpcError | None = exc

        async def again() -> Any:
            nonlocal first
            if first is not None:  # attempt 1 already failed: let tenacity count it and wait
                failed, first = first, None
                raise failed
            return await attempt()

        return await self.retrying(idempotent, method)(again)

    async def exchange(
        self, method: str, body: Callable[[Any], Awaitable[T]], *, deadline: float, only: Any = None
    ) -> T:
        """Open bidirectional ``method`` and run ``body(call)`` on grpc.aio's call object (``write``,
        ``done_writing``, ``read``), holding an in-flight slot; a failed status surfaces as ``RpcError``.
        The call is cancelled once ``body`` returns if it is still open (a body may stop at the
        message it needs). Never retried here: the caller decides.

        ``only``: the one message the client sends. It then goes out with the call's headers and
        the half-close in one batch (the method called as server-streaming: on the wire the same
        as a stream that writes one message and half-closes), and ``body`` only reads."""
        self.calls[method] += 1
        async with self._slots:
            if only is None:
                call = getattr(self.stub, method)(timeout=deadline, metadata=self.metadata)
            else:
                call = self._one_way(method)(only, timeout=deadline, metadata=self.metadata)

            async def run() -> T:
                try:
                    return await body(call)
                except grpc.aio.AioRpcError as exc:
                    raise _parse(exc) from exc

            try:
                if only is not None:
                    # In the caller's task (a task of its own is a loop round trip more per exec): a
                    # server-streaming call's reads re-raise the caller's own CancelledError, which an anyio
                    # cancel scope then claims. A bidirectional call's start swallows a cancellation and a
                    # later write raises a fresh one, so that body runs in a task (see ``_joined``).
                    return await run()
                return await _joined(asyncio.get_running_loop().create_task(run()), call)
            finally:
                if not call.done():
                    call.cancel()

    def _one_way(self, method: str) -> Any:
        """``method`` (bidirectional in the protocol) as a server-streaming multicallable, made once."""
        made = self._one_ways.get(method)
        if made is None:
            from cwsandbox._proto import sandbox_pb2 as pb

            rpc = pb.DESCRIPTOR.services_by_name["SandboxService"].methods_by_name[method]
            request_class: Any = getattr(pb, rpc.input_type.name)
            response_class: Any = getattr(pb, rpc.output_type.name)
            path = f"/{rpc.containing_service.full_name}/{method}"
            serialize, deserialize = request_class.SerializeToString, response_class.FromString
            try:
                # registered: the channel interns the method once, not on every call (grpc's generated code does
                # the same; the keyword is grpc's, marked for that use)
                made = self._channel.unary_stream(
                    path, request_serializer=serialize, response_deserializer=deserialize, _registered_method=True
                )
            except TypeError:  # a grpc without the keyword
                made = self._channel.unary_stream(path, request_serializer=serialize, response_deserializer=deserialize)
            self._one_ways[method] = made
        return made

    async def aclose(self) -> None:
        await self._channel.close(grace=None)
