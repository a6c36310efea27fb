"""The exec subresource of the test server: the WebSocket channel protocol, byte for byte, over real processes.

What a client sees from kube-apiserver + kubelet (k8s apimachinery wsstream, kubelet
remotecommand, the apiserver's v5 StreamTranslator):

- Before the upgrade the apiserver refuses, with a ``Status`` body: a missing pod (404),
  a plain GET (400 "Upgrade request required"), no command, a container name that is
  not in the pod, a pod with no node yet, a pod whose phase is Failed or Succeeded
  (400 "cannot exec into a container in a completed pod"). A client that offers no
  subprotocol the server speaks gets 403 (x/net/websocket refuses the handshake).
- After the upgrade, the server picks the first client-offered subprotocol it speaks
  and sends one empty frame on the lowest output channel (``b"\\x01"``). A container
  that is not running is reported *after* the upgrade: an ``InternalError`` Status on
  channel 3, then close.
- stdout/stderr stream as ``b"\\x01"+data``/``b"\\x02"+data``; stdin arrives as
  ``b"\\x00"+data`` in BINARY or TEXT frames (the Go server reads both alike); channel
  4 (resize) is ignored; on v5 ``b"\\xff\\x00"`` closes stdin. When the process exits and
  its pipes reach EOF, the v4 ``Status`` goes on channel 3 (exit codes of signal deaths
  as 128+N, like the container runtime), then close.
- **Closing the socket does not kill the command** (kubernetes#89031): its stdin gets
  EOF and its output is read and dropped (a kubelet stops reading; the process would
  block once the pipe is full); it runs on until it exits or the container dies.
- **The container dying mid-exec** (eviction, OOM kill, deadline, deletion) kills the
  command (SIGKILL via its PID namespace); the exec then reports exit code 137 on
  channel 3 before the pod turns Failed, or, as ``server.on_container_death`` says,
  hangs with no status (kubernetes#129144) or closes with none.

Commands run inside the pod's container (``container.Container``): all execs of a pod
share its PID namespace, mounts and user. Not an isolation boundary: a test double.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from .state import status_body, status_response

if TYPE_CHECKING:
    from .server import KubeTestServer
    from .state import PodRuntime

__all__ = ["handle_exec"]

READ_CHUNK = 32 * 1024


def exit_status(rc: int, command: list[str]) -> dict[str, Any]:
    if rc == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command {command}, exit code {rc}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(rc)}]},
    }


def _offered(request: web.Request) -> list[str]:
    header = ",".join(request.headers.getall("Sec-WebSocket-Protocol", []))
    return [p.strip() for p in header.split(",") if p.strip()]


def _refusal(server: KubeTestServer, rt: PodRuntime | None, request: web.Request) -> web.StreamResponse | None:
    """What the apiserver answers before any upgrade, or None to go on."""
    name = request.match_info["name"]
    if rt is None:
        return status_response(404, "NotFound", f'pods "{name}" not found')
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return status_response(400, "BadRequest", "Upgrade request required")
    if not request.query.getall("command", []):
        return status_response(400, "BadRequest", "you must specify at least 1 command")
    container = request.query.get("container", rt.obj["spec"]["containers"][0]["name"])
    if container not in [c["name"] for c in rt.obj["spec"]["containers"]]:
        return status_response(400, "BadRequest", f"container {container} is not valid for pod {name}")
    if not rt.obj["spec"].get("nodeName"):
        return status_response(400, "BadRequest", f"pod {name} does not have a host assigned")
    phase = rt.obj["status"].get("phase")
    if phase in ("Failed", "Succeeded"):
        msg = f"cannot exec into a container in a completed pod; current phase is {phase}"
        return status_response(400, "BadRequest", msg)
    flags = [request.query.get(k, "false") not in ("", "false", "0") for k in ("stdin", "stdout", "stderr")]
    if not any(flags):
        return status_response(400, "BadRequest", "you must specify at least one of stdin, stdout, stderr")
    if not any(p in server.protocols for p in _offered(request)):
        msg = f"unable to upgrade: requested protocol(s) are not supported: {_offered(request)}"
        return web.Response(status=403, text=msg)
    return None


async def handle_exec(server: KubeTestServer, request: web.Request) -> web.StreamResponse:
    ns, name = request.match_info["ns"], request.match_info["name"]
    rt = server.pods.get((ns, name))
    refusal = _refusal(server, rt, request)
    if refusal is not None:
        return refusal
    assert rt is not None
    command = request.query.getall("command", [])
    flag = {k: request.query.get(k, "false") not in ("", "false", "0") for k in ("stdin", "stdout", "stderr")}
    path = request.path
    no_status = server.take_fault("GET", path, "exec_no_status")
    fake_status = server.take_fault("GET", path, "exec_status")
    drop = server.take_fault("GET", path, "exec_drop")

    protocol = next(p for p in _offered(request) if p in server.protocols)
    ws = web.WebSocketResponse(protocols=(protocol,), max_msg_size=0, autoping=True)
    await ws.prepare(request)
    server.exec_protocols.append(ws.ws_protocol or "")
    if drop is not None:
        await ws.close()
        return ws
    await ws.send_bytes(b"\x01" if flag["stdout"] else b"\x02" if flag["stderr"] else b"\x03")
    container = rt.container
    if container is None or not container.running:
        reason = f'container not found ("{request.query.get("container", "main")}")'
        if container is not None and container.exit_code is not None:
            reason = "container is not running"
        msg = f"Internal error occurred: error executing command in container: {reason}"
        err = status_body(500, "InternalError", msg)
        await ws.send_bytes(b"\x03" + json.dumps(err).encode())
        await ws.close()
        return ws
    proc = await container.exec(command, stdin=flag["stdin"])
    sockets = server._exec_sockets.setdefault((ns, name), set())
    sockets.add(ws)
    v5 = protocol == "v5.channel.k8s.io"
    attached = True

    async def pump(stream: asyncio.StreamReader | None, channel: int) -> None:
        if stream is None:
            return
        while data := await stream.read(READ_CHUNK):
            if attached and flag["stdout" if channel == 1 else "stderr"] and not ws.closed:
                with contextlib.suppress(ConnectionResetError, RuntimeError):
                    await ws.send_bytes(bytes([channel]) + data)

    def close_stdin() -> None:
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()

    async def read_client() -> None:
        nonlocal attached
        async for msg in ws:
            if msg.type is WSMsgType.BINARY:
                data: bytes = msg.data
            elif msg.type is WSMsgType.TEXT:
                data = msg.data.encode()
            else:
                continue
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == 0:
                server.max_stdin_frame = max(server.max_stdin_frame, len(payload))
                if proc.stdin is not None and not proc.stdin.is_closing():
                    try:
                        proc.stdin.write(payload)
                        await proc.stdin.drain()
                    except (BrokenPipeError, ConnectionResetError):
                        pass
            elif channel == 255 and v5 and payload == b"\x00":
                close_stdin()
        # The client went away. A kubelet does NOT kill the command: it only ends its stdin.
        attached = False
        close_stdin()

    reader = asyncio.create_task(read_client())
    pumps = asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
    try:
        await asyncio.wait({pumps, reader}, return_when=asyncio.FIRST_COMPLETED)
        if not pumps.done() and reader.done():
            server.detach(rt, proc, pumps)  # runs on; reaped when it exits or the container dies
            return ws
        await pumps
        rc = await proc.wait()
        if rc < 0:
            rc = 128 - rc  # the container runtime reports a signal death as 128+N
        died = container.exit_code is not None
        if died and server.on_container_death == "hang":
            await reader  # no status, ever: until the client gives up
            return ws
        if ws.closed or no_status is not None or (died and server.on_container_death == "close"):
            return ws
        status = fake_status.status_json if fake_status is not None else exit_status(rc, command)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await ws.send_bytes(b"\x03" + json.dumps(status).encode())
    finally:
        sockets.discard(ws)
        if proc.returncode is not None:
            container.execs.discard(proc)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        with contextlib.suppress(Exception):
            await ws.close()
    return ws
