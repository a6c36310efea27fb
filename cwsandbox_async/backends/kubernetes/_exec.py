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
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import anyio

from ..._errors import SandboxTransportError, SandboxValidationError
from ..._log import log
from ._client import KubeClient, translate_transport

__all__ = ["PROTOCOLS", "ExecStatusError", "StreamResult", "exit_code", "stream_exec", "wrap_command"]

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN_CHUNK = 128 * 1024
#: The longest exec URL we send (argv travels in the query string; Go's header limit is 1 MiB).
MAX_URL_BYTES = 512 * 1024
#: After the status arrives, how long to wait for the server's close (pitfall 2: accept without it).
DRAIN_SECONDS = 1.0

OnChunk = Callable[[int, bytes], Awaitable[None]]

#: Runs a user's command: cd, export env, cap CPU time, enforce the timeout inside the container
#: (``timeout -k``; it signals the command's whole process group), and end stdin after exactly N
#: bytes so EOF works on v4 too. Arguments: cwd, env count, timeout, cpu seconds, stdin bytes,
#: the ``K=V`` pairs, then the argv. A cwd that does not exist exits 127.
EXEC_WRAPPER = (
    'cd -- "$1" || exit 127; n=$2; t=$3; c=$4; i=$5; shift 5; '
    'while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n - 1)); done; '
    '[ "$c" = 0 ] || ulimit -t "$c" 2>/dev/null; '
    'if command -v timeout >/dev/null 2>&1; then set -- timeout -k "$KILL_AFTER" "$t" "$@"; fi; '
    'if [ "$i" = 0 ]; then exec "$@" </dev/null; fi; '
    'head -c "$i" | "$@"'
)
#: Seconds ``timeout`` waits after SIGTERM before SIGKILL.
KILL_AFTER_SECONDS = 2


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def wrap_command(
    argv: Sequence[str], *, cwd: str, env: Mapping[str, str], timeout: float, cpu_seconds: int | None, stdin_len: int
) -> list[str]:
    """The argv that runs ``argv`` under ``EXEC_WRAPPER``."""
    pairs = [f"{k}={v}" for k, v in env.items()]
    head = [cwd, str(len(pairs)), _seconds(timeout), str(cpu_seconds or 0), str(stdin_len)]
    script = EXEC_WRAPPER.replace("$KILL_AFTER", str(KILL_AFTER_SECONDS))
    return ["/bin/sh", "-c", script, "cwsandbox", *head, *pairs, *argv]


class ExecStatusError(SandboxTransportError):
    """The status channel reported a failure that is not the command's exit code."""

    def __init__(self, message: str, *, status: dict[str, Any], sandbox_id: str | None = None) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.status = status


@dataclass
class StreamResult:
    """How one exec stream ended. ``status`` is None when the server sent none (then ``truncated`` or
    ``deadline_hit`` says why we stopped reading, or the stream broke)."""

    status: dict[str, Any] | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    deadline_hit: bool
    protocol: str
    wall_seconds: float


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


async def _close(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Close the socket even while being cancelled (shielded, bounded)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(2.0), contextlib.suppress(aiohttp.ClientError, OSError):
        await ws.close()


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
    max_stdout: int | None = None,
    max_stderr: int | None = None,
    on_chunk: OnChunk | None = None,
) -> StreamResult:
    """Run ``argv`` in the pod and collect its output until the status arrives.

    Stops early (and closes the socket, which ends the command's pipes) when a stream
    passes its cap, ``max_stdout``/``max_stderr`` bytes (``truncated``), or when
    ``deadline_seconds`` pass (``deadline_hit``). Raises ``KubeApiError``/``SandboxBackendUnavailableError`` if the
    upgrade fails and ``SandboxTransportError`` if the socket breaks.
    """
    params = exec_params(argv, container)
    start = time.monotonic()
    ws = await client.ws_connect(exec_path(namespace, pod), params, PROTOCOLS, budget=connect_timeout)
    protocol = ws.protocol or ""
    out: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
    caps = {1: max_stdout, 2: max_stderr}
    status: dict[str, Any] | None = None
    truncated = deadline_hit = False
    error: BaseException | None = None
    try:
        if protocol not in PROTOCOLS:
            raise SandboxTransportError(f"exec: server negotiated {protocol or 'no'} subprotocol; need v4 or v5")

        async def send_stdin() -> None:
            data = memoryview(stdin or b"")
            try:
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
                        with anyio.move_on_after(DRAIN_SECONDS):
                            async for _ in ws:  # wait for the close; frames after the status are ignored
                                pass
                        return
            except Exception as exc:  # re-raised below, outside the task group (no ExceptionGroup)
                error = exc

        with anyio.move_on_after(deadline_seconds) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(send_stdin)
                await receive()
                tg.cancel_scope.cancel()
        deadline_hit = scope.cancelled_caught and status is None
        if isinstance(error, aiohttp.ClientError | OSError | ValueError):
            raise translate_transport(error, f"exec in {pod}") from error
        if error is not None:
            raise error
    finally:
        await _close(ws)
    wall = time.monotonic() - start
    log.debug("k8s exec stream ended", pod=pod, protocol=protocol, status=bool(status), wall=round(wall, 4))
    return StreamResult(status, bytes(out[1]), bytes(out[2]), truncated, deadline_hit, protocol, wall)
