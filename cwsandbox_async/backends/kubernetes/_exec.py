"""Exec over the pod ``exec`` subresource's WebSocket channel protocol (v5, falling back to v4).

Wire facts (kubernetes.md section 1): every binary message is one channel byte plus
payload: 0 stdin, 1 stdout, 2 stderr, 3 status (one JSON ``Status``), 255 close
(v5 only: ``b"\\xff\\x00"`` half-closes stdin). The server first sends an empty frame
on the lowest output channel; it is not data. The exit code comes only from the
status: ``Success`` is 0, a ``Failure`` with an ``ExitCode`` cause is that code; any
other failure is an infrastructure error. A socket that closes without a status is a
``SandboxTransportError`` (never exit 0).

Output stays bytes; the caller decodes once. Stdin goes in ``STDIN_CHUNK`` frames.
``stdin=true`` is always requested (a Kata shim ends stdin-less WebSocket execs early).
Commands run in a session of their own (``_inpod.SESSION``); the session id that leads
stderr is split off and reported in ``StreamResult.session``.

Why not kubernetes-asyncio's ``WsApiClient``: it speaks only ``v4.channel.k8s.io`` (no
stdin EOF), drops the status channel in preload mode, decodes UTF-8 per frame and ignores
``proxy-url``/``tls-server-name`` on the socket (kubernetes.md section 3). This module
keeps the one part of the protocol we need, on the same aiohttp session.

A stream this module stops reading before its status (output cap, deadline, the pod died,
cancellation, a broken socket) is *abandoned*: its socket and what it knows of the
session go to ``on_abandon``, which closes the socket and kills the session in the
background; a closed socket alone does not stop a command on a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import anyio

from ..._errors import SandboxTransportError, SandboxValidationError
from ..._log import log
from ._client import KubeClient, translate_transport
from ._inpod import GO, SessionHeader, session_token

__all__ = [
    "PROTOCOLS",
    "Abandoned",
    "ExecStatusError",
    "StreamResult",
    "exit_code",
    "stream_exec",
]

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN_CHUNK = 128 * 1024
#: The longest exec URL we send (argv travels in the query string; Go's header limit is 1 MiB).
MAX_URL_BYTES = 512 * 1024

OnChunk = Callable[[int, bytes], Awaitable[None]]


class ExecStatusError(SandboxTransportError):
    """The status channel reported a failure that is not the command's exit code."""

    def __init__(self, message: str, *, status: dict[str, Any], sandbox_id: str | None = None) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.status = status


@dataclass
class StreamResult:
    """How one exec stream ended. ``status`` is None when the server sent none (then ``truncated``,
    ``deadline_hit`` or ``aborted`` says why we stopped reading, or the stream closed without one).
    ``session`` is the command's session id, when the stream announced one."""

    status: dict[str, Any] | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    deadline_hit: bool
    aborted: bool
    protocol: str
    wall_seconds: float
    session: int | None


@dataclass
class Abandoned:
    """A stream given up before its status: the open socket and the session header read so far."""

    ws: aiohttp.ClientWebSocketResponse
    header: SessionHeader
    why: str
    #: The ``in_session`` wrapper's token (``_inpod.session_token``): kills it when no session id was read.
    token: str | None = None

    @property
    def session(self) -> int | None:
        return self.header.session


OnAbandon = Callable[[Abandoned], None]


def exit_code(status: dict[str, Any], sandbox_id: str | None = None) -> int:
    """The exit code a channel-3 ``Status`` carries; ``ExecStatusError`` if it carries none."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", ""))
            except ValueError:
                break
    message = status.get("message") or json.dumps(status)[:300]
    raise ExecStatusError(f"exec failed without an exit code: {message}", status=status, sandbox_id=sandbox_id)


def exec_path(namespace: str, pod: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/exec"


def exec_params(argv: Sequence[str], container: str) -> list[tuple[str, str]]:
    params = [("command", a) for a in argv]
    params += [("container", container), ("stdin", "true"), ("stdout", "true"), ("stderr", "true"), ("tty", "false")]
    size = sum(len(quote(v, safe="")) + len(k) + 2 for k, v in params)
    if size > MAX_URL_BYTES:
        raise SandboxValidationError(
            f"command is {size} bytes once URL-encoded; Kubernetes exec takes at most {MAX_URL_BYTES} "
            "(pass large input through stdin or a file)"
        )
    return params


async def close_socket(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Close a socket; a broken one is already as closed as it gets."""
    with contextlib.suppress(aiohttp.ClientError, OSError):
        await ws.close()


async def read_header(ws: aiohttp.ClientWebSocketResponse, header: SessionHeader) -> None:
    """Read an abandoned stream until its session header is complete (or the stream ends)."""
    async for msg in ws:
        if header.done:
            return
        if msg.type is aiohttp.WSMsgType.BINARY and msg.data[:1] == b"\x02":
            header.feed(msg.data[1:])
        elif msg.type is aiohttp.WSMsgType.BINARY and msg.data[:1] == b"\x03":
            return


async def stream_exec(
    client: KubeClient,
    namespace: str,
    pod: str,
    argv: Sequence[str],
    *,
    container: str,
    stdin: bytes | None,
    deadline_seconds: float,
    connect_timeout: float,
    drain_seconds: float,
    on_abandon: OnAbandon,
    max_stdout: int | None = None,
    max_stderr: int | None = None,
    on_chunk: OnChunk | None = None,
    abort: Callable[[], Awaitable[None]] | None = None,
    gate: bool = False,
) -> StreamResult:
    """Run ``argv`` (an ``_inpod.in_session`` command) in the pod and collect its output until the status.

    Stops early when a stream passes its cap, ``max_stdout``/``max_stderr`` bytes
    (``truncated``), when ``deadline_seconds`` pass (``deadline_hit``), or when ``abort``
    returns (``aborted``: the caller learnt the pod died). After the status, waits up to
    ``drain_seconds`` for the server's close. Every early stop, cancellation and broken
    socket hands the socket to ``on_abandon``. Raises ``KubeApiError``/
    ``SandboxBackendUnavailableError`` if the upgrade fails and ``SandboxTransportError``
    if the socket breaks. ``gate``: the command is an ``_inpod.in_session`` one, waiting for ``GO``.
    """
    params = exec_params(argv, container)
    start = time.monotonic()
    ws = await client.ws_connect(exec_path(namespace, pod), params, PROTOCOLS, budget=connect_timeout)
    protocol = ws.protocol or ""
    header = SessionHeader()
    out: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
    caps = {1: max_stdout, 2: max_stderr}
    status: dict[str, Any] | None = None
    truncated = deadline_hit = aborted = False
    error: BaseException | None = None
    finished = False
    try:
        if protocol not in PROTOCOLS:
            raise SandboxTransportError(f"exec: server negotiated {protocol or 'no'} subprotocol; need v4 or v5")

        async def send_stdin() -> None:
            data = memoryview(stdin or b"")
            try:
                if gate:
                    await ws.send_bytes(b"\x00" + GO)
                for i in range(0, len(data), STDIN_CHUNK):
                    await ws.send_bytes(b"\x00" + data[i : i + STDIN_CHUNK].tobytes())
                if protocol.startswith("v5"):
                    await ws.send_bytes(b"\xff\x00")  # half-close stdin; output keeps flowing
            except (aiohttp.ClientError, OSError):
                pass  # the socket broke; the receiver sees the missing status

        async def receive() -> None:
            nonlocal status, truncated, error
            try:
                async for msg in ws:
                    if msg.type is not aiohttp.WSMsgType.BINARY or not msg.data:
                        continue
                    channel, payload = msg.data[0], msg.data[1:]
                    if channel == 2 and not header.done:
                        payload = header.feed(payload)
                    if channel in (1, 2) and payload:
                        buf, cap = out[channel], caps[channel]
                        if cap is not None and len(buf) + len(payload) > cap:
                            payload = payload[: cap - len(buf)]
                            truncated = True
                        buf += payload
                        if on_chunk is not None and payload:
                            await on_chunk(channel, payload)
                        if truncated:
                            return
                    elif channel == 3:
                        doc = json.loads(payload)
                        if not isinstance(doc, dict):
                            raise ValueError(f"status channel sent {type(doc).__name__}, not a Status object")
                        status = doc
                        with anyio.move_on_after(drain_seconds):
                            async for _ in ws:  # wait for the close; frames after the status are ignored
                                pass
                        return
            except (aiohttp.ClientError, OSError, ValueError) as exc:  # re-raised below, outside the task group
                error = exc

        async def watch_abort() -> None:
            nonlocal aborted
            assert abort is not None
            await abort()
            aborted = True
            tg.cancel_scope.cancel()

        with anyio.move_on_after(deadline_seconds) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(send_stdin)
                if abort is not None:
                    tg.start_soon(watch_abort)
                await receive()
                tg.cancel_scope.cancel()
        deadline_hit = scope.cancelled_caught and status is None and not aborted
        if error is not None:
            raise translate_transport(error, f"exec in {pod}") from error
        finished = status is not None and not truncated
    finally:
        if finished:
            await close_socket(ws)
        else:
            why = "truncated" if truncated else "deadline" if deadline_hit else "aborted" if aborted else "broken"
            on_abandon(Abandoned(ws, header, why, session_token(argv)))
    wall = time.monotonic() - start
    log.debug("k8s exec stream ended", pod=pod, protocol=protocol, status=bool(status), wall=round(wall, 4))
    stdout, stderr = bytes(out[1]), bytes(out[2])
    return StreamResult(status, stdout, stderr, truncated, deadline_hit, aborted, protocol, wall, header.session)
