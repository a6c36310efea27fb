"""The API funnel: REST calls, watch streams and WebSocket upgrades over kubernetes-asyncio's session.

The connection (TLS context, proxy, SNI, credentials) is kubernetes-asyncio's
(``_connect``): its ``RESTClientObject`` owns the aiohttp session and its
``Configuration`` hands out the ``Authorization`` header. What this module adds, and
kubernetes-asyncio does not have: every call goes through one funnel: a client-side
rate limit (``qps``/``burst``, an ``aiolimiter.AsyncLimiter``), an in-flight cap for
short requests, tenacity retries with jittered exponential backoff that honour a
429/503 ``Retry-After``, credentials refreshed once after a 401, an overall deadline,
and request counts by verb. Bodies stay plain JSON dicts (no model classes: a pod list
or watch event is not deserialised into 700 generated types). What escapes is always
in the library's tree:

- ``KubeApiError`` (a ``SandboxTransportError``) for an HTTP error status or a broken
  connection, with ``.status`` (None when no response came) and the API ``reason``;
- ``SandboxBackendUnavailableError`` when the server cannot be reached at all, TLS
  verification fails, or credentials are rejected;
- ``SandboxTimeoutError`` when the overall deadline passes.
"""

from __future__ import annotations

import json
import random
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import aiohttp
import anyio
from aiolimiter import AsyncLimiter
from kubernetes_asyncio.client.rest import RESTClientObject
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from ..._errors import SandboxBackendUnavailableError, SandboxTimeoutError, SandboxTransportError
from ..._log import log
from ._connect import Connection
from ._options import KubernetesOptions

__all__ = ["KubeApiError", "KubeClient", "Params"]

T = TypeVar("T")
Params = Sequence[tuple[str, str]]
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
USER_AGENT = "cwsandbox-async/0.1.0"
#: Writes ask the server to refuse unknown fields (its default, Warn, drops them with a 201).
_STRICT = ("fieldValidation", "Strict")
_WRITES = frozenset({"POST", "PUT", "PATCH"})
#: Distinct ``Warning`` texts logged at WARNING per client; repeats go to DEBUG.
_MAX_WARNINGS = 1000


class KubeApiError(SandboxTransportError):
    """The API server answered with an error status, or the connection broke before it answered."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str | None = None,
        retry_after: float | None = None,
        connect: bool = False,
        sandbox_id: str | None = None,
    ) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after
        self.connect = connect

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status in _RETRY_STATUSES


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = (headers or {}).get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        import time

        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def warning_texts(values: Sequence[str]) -> list[str]:
    """The texts of RFC 7234 ``Warning`` header values as kube-apiserver sends them (``299 - "text"``)."""
    out = []
    for value in values:
        code, _, rest = value.partition(" ")
        _agent, _, text = rest.partition(" ")
        text = text.strip()
        if code.isdigit() and len(text) >= 2 and text[0] == text[-1] == '"':
            out.append(text[1:-1].replace('\\"', '"'))
        else:
            out.append(value.strip())
    return out


def _status_error(what: str, status: int, body: bytes, headers: Mapping[str, str] | None) -> KubeApiError:
    reason, message = None, body[:300].decode(errors="replace").strip()
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            reason, message = doc.get("reason"), doc.get("message") or message
    except ValueError:
        pass
    return KubeApiError(
        f"{what}: HTTP {status} {reason or ''}: {message}".replace("  ", " "),
        status=status,
        reason=reason,
        retry_after=_retry_after(headers),
    )


def translate_transport(exc: BaseException, what: str) -> SandboxTransportError | SandboxBackendUnavailableError:
    """One place that turns an aiohttp/OS error into the library's tree."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return SandboxBackendUnavailableError(f"{what}: TLS verification failed: {exc}")
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return SandboxBackendUnavailableError(f"{what}: proxy refused the connection: HTTP {exc.status}")
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return SandboxBackendUnavailableError(f"{what}: invalid URL {exc}", infrastructure=False)
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        return KubeApiError(
            f"{what}: WebSocket upgrade refused: HTTP {exc.status} {exc.message}",
            status=exc.status,
            retry_after=_retry_after(exc.headers),
        )
    connect = isinstance(exc, aiohttp.ClientConnectorError)
    return KubeApiError(f"{what}: {type(exc).__name__}: {exc}", connect=connect)


_TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)


@dataclass(frozen=True)
class _Auth:
    """What one attempt carries: the session to use and the Authorization header (None: anonymous)."""

    rest: RESTClientObject
    authorization: str | None
    generation: int


def _rest_client(conn: Connection) -> RESTClientObject:
    """kubernetes-asyncio's session for ``conn`` (its TLS context from the CA, client certificate and
    verify settings). Raises ``SandboxBackendUnavailableError`` for TLS material it cannot load."""
    conn.configuration.connection_pool_maxsize = 0  # no cap: each exec holds a connection of its own
    try:
        return RESTClientObject(conn.configuration)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise SandboxBackendUnavailableError(  # the caller's kubeconfig
            f"bad TLS material in {conn.source}: {exc}", infrastructure=False
        ) from exc


class KubeClient:
    """The API client one backend owns. Create inside a running event loop; ``aclose`` when done."""

    def __init__(self, conn: Connection, opts: KubernetesOptions) -> None:
        self.conn = conn
        self.opts = opts
        # client-go's QPS/Burst: ``burst`` requests at once, then ``qps`` per second
        self.limiter = AsyncLimiter(opts.burst, opts.burst / opts.qps)
        self._in_flight = anyio.CapacityLimiter(opts.max_in_flight)
        self._rest: RESTClientObject | None = None
        self._retired: list[RESTClientObject] = []
        self._generation = 0
        self._refresh_lock = anyio.Lock()
        self.calls: Counter[str] = Counter()
        self.retries = 0
        self.warnings: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()  # error statuses answered (every attempt), e.g. 429s seen

    def _session(self) -> RESTClientObject:
        if self._rest is None:
            self._rest = _rest_client(self.conn)
        return self._rest

    async def _auth(self) -> _Auth:
        header = await self.conn.configuration.get_api_key_with_prefix("BearerToken")
        return _Auth(self._session(), header or None, self._generation)

    async def _refresh(self, auth: _Auth) -> bool:
        """After a 401 with ``auth``: refresh the credentials once (whoever comes first); False if they
        cannot change."""
        async with self._refresh_lock:
            if auth.generation != self._generation:
                return True  # someone else already refreshed
            cert = (self.conn.configuration.cert_file, self.conn.configuration.key_file)
            if not await self.conn.refresh():
                return False
            if (self.conn.configuration.cert_file, self.conn.configuration.key_file) != cert and self._rest:
                self._retired.append(self._rest)  # a new client certificate: a new TLS context
                self._rest = None
            self._generation += 1
            return True

    def _warned(self, what: str, values: Sequence[str]) -> None:
        """Log the server's ``Warning`` headers: each distinct text once at WARNING, repeats at DEBUG."""
        for text in warning_texts(values):
            first = text not in self.warnings
            if first and len(self.warnings) >= _MAX_WARNINGS:
                first = False
            else:
                self.warnings[text] += 1
            (log.warning if first else log.debug)("k8s API warning", what=what, warning=text)

    def url(self, path: str) -> str:
        return self.conn.server + path

    @staticmethod
    def _kwargs(auth: _Auth) -> dict[str, Any]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if auth.authorization:
            headers["Authorization"] = auth.authorization
        kw: dict[str, Any] = {"headers": headers}
        if auth.rest.server_hostname:
            kw["server_hostname"] = auth.rest.server_hostname
        if auth.rest.proxy:
            kw["proxy"] = auth.rest.proxy
            if auth.rest.proxy_headers:
                kw["proxy_headers"] = auth.rest.proxy_headers
        return kw

    def _wait(self, state: RetryCallState) -> float:
        backoff = min(self.opts.max_backoff_seconds, 0.1 * 2 ** (state.attempt_number - 1)) * random.uniform(0.5, 1.0)
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, KubeApiError) and exc.retry_after is not None:
            return min(self.opts.max_retry_after_seconds, exc.retry_after) + random.uniform(0.0, 0.05)
        return float(backoff)

    async def _retrying(self, what: str, budget: float, once: Callable[[], Awaitable[T]]) -> T:
        """Run ``once`` with retries on retryable errors, within ``budget`` seconds overall."""

        def before_sleep(state: RetryCallState) -> None:
            self.retries += 1
            exc = state.outcome.exception() if state.outcome is not None else None
            log.debug("k8s retry", what=what, attempt=state.attempt_number, error=repr(exc))

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.opts.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception(lambda e: isinstance(e, KubeApiError) and e.retryable),
            sleep=anyio.sleep,
            reraise=True,
            before_sleep=before_sleep,
        )
        try:
            with anyio.fail_after(budget):
                async for attempt in retrying:
                    with attempt:
                        return await once()
        except SandboxTimeoutError:
            raise
        except TimeoutError as exc:
            raise SandboxTimeoutError(f"{what} did not finish within {budget:g} s", infrastructure=True) from exc
        except KubeApiError as exc:
            if exc.connect:
                raise SandboxBackendUnavailableError(
                    f"cannot reach the Kubernetes API at {self.conn.server}: {exc.message}"
                ) from exc
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _authorized(self, what: str, send: Callable[[_Auth], Awaitable[T]]) -> T:
        """Send with the current credentials; after a 401, refresh them once and send again."""
        auth = await self._auth()
        try:
            return await send(auth)
        except KubeApiError as exc:
            if exc.status != 401 or not await self._refresh(auth):
                if exc.status == 401:
                    raise SandboxBackendUnavailableError(
                        f"{what}: credentials rejected (401)", infrastructure=False
                    ) from exc
                raise
        auth = await self._auth()
        try:
            return await send(auth)
        except KubeApiError as exc:
            if exc.status == 401:
                raise SandboxBackendUnavailableError(
                    f"{what}: credentials rejected after refresh (401)", infrastructure=False
                ) from exc
            raise

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = (),
        body: Any = None,
        content_type: str = "application/json",
        budget: float | None = None,
        what: str | None = None,
        forbidden_is_unavailable: bool = True,
    ) -> dict[str, Any]:
        """One REST call (all retries within ``budget`` seconds); returns the decoded JSON object.

        Raises as the module docstring says; a 403 (RBAC) is ``SandboxBackendUnavailableError``
        unless ``forbidden_is_unavailable`` is False (a create refused by admission)."""
        what = what or f"{method} {path}"
        if method in _WRITES and not any(k == _STRICT[0] for k, _ in params):
            params = [*params, _STRICT]
        per_try = aiohttp.ClientTimeout(total=self.opts.request_timeout_seconds)
        data = json.dumps(body).encode() if body is not None else None

        async def send(auth: _Auth) -> dict[str, Any]:
            kw = self._kwargs(auth)
            if data is not None:
                kw["headers"]["Content-Type"] = content_type
            try:
                async with auth.rest.pool_manager.request(
                    method, self.url(path), params=list(params), data=data, timeout=per_try, **kw
                ) as resp:
                    raw = await resp.read()
                    if warnings := resp.headers.getall("Warning", ()):
                        self._warned(what, warnings)
                    if resp.status >= 400:
                        self.statuses[resp.status] += 1
                        raise _status_error(what, resp.status, raw, resp.headers)
            except _TRANSPORT_ERRORS as exc:
                raise translate_transport(exc, what) from exc
            try:
                doc = json.loads(raw) if raw else {}
            except ValueError as exc:
                raise KubeApiError(f"{what}: response is not JSON", status=resp.status) from exc
            if not isinstance(doc, dict):
                raise KubeApiError(f"{what}: response is not a JSON object", status=resp.status)
            return doc

        async def once() -> dict[str, Any]:
            await self.limiter.acquire()
            async with self._in_flight:
                self.calls[method] += 1
                return await self._authorized(what, send)

        try:
            return await self._retrying(what, budget or 2 * self.opts.request_timeout_seconds, once)
        except KubeApiError as exc:
            if exc.status == 403 and forbidden_is_unavailable:
                raise SandboxBackendUnavailableError(  # the caller's RBAC configuration
                    f"{exc.message} (check the RBAC rules; see the README)", infrastructure=False
                ) from exc
            raise

    @asynccontextmanager
    async def stream(self, path: str, params: Params, *, read_timeout: float) -> AsyncIterator[aiohttp.ClientResponse]:
        """A long-running GET (a watch): yields the response once its status is 200. Not retried here."""
        what = f"WATCH {path}"
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.opts.request_timeout_seconds, sock_read=read_timeout
        )

        async def send(auth: _Auth) -> aiohttp.ClientResponse:
            try:
                resp = await auth.rest.pool_manager.get(
                    self.url(path), params=list(params), timeout=timeout, **self._kwargs(auth)
                )
            except _TRANSPORT_ERRORS as exc:
                raise translate_transport(exc, what) from exc
            if resp.status >= 400:
                self.statuses[resp.status] += 1
                try:
                    raw = await resp.read()
                except _TRANSPORT_ERRORS:
                    raw = b""
                resp.release()
                raise _status_error(what, resp.status, raw, resp.headers)
            return resp

        await self.limiter.acquire()
        self.calls["WATCH"] += 1
        with anyio.fail_after(2 * self.opts.request_timeout_seconds):
            resp = await self._authorized(what, send)
        try:
            yield resp
        finally:
            resp.close()

    async def ws_connect(
        self, path: str, params: Params, protocols: Sequence[str], *, budget: float
    ) -> aiohttp.ClientWebSocketResponse:
        """Upgrade to a WebSocket (exec). The handshake is retried like a REST call; the caller closes it."""
        what = f"exec {path}"

        async def send(auth: _Auth) -> aiohttp.ClientWebSocketResponse:
            try:
                ws: aiohttp.ClientWebSocketResponse = await auth.rest.pool_manager.ws_connect(
                    self.url(path),
                    params=list(params),
                    protocols=protocols,
                    heartbeat=self.opts.ws_heartbeat_seconds,
                    max_msg_size=0,
                    timeout=aiohttp.ClientWSTimeout(ws_close=self.opts.drain_seconds),
                    **self._kwargs(auth),
                )
            except _TRANSPORT_ERRORS as exc:
                if isinstance(exc, aiohttp.WSServerHandshakeError):
                    self.statuses[exc.status] += 1
                raise translate_transport(exc, what) from exc
            return ws

        async def once() -> aiohttp.ClientWebSocketResponse:
            await self.limiter.acquire()
            self.calls["EXEC"] += 1
            return await self._authorized(what, send)

        return await self._retrying(what, budget, once)

    async def aclose(self) -> None:
        rests = [*self._retired, *([self._rest] if self._rest is not None else [])]
        self._rest, self._retired = None, []
        for rest in rests:
            await rest.close()
