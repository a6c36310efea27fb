"""Exec on the CoreWeave service: the unary ``Exec`` RPC, or ``StreamExec`` where streaming or stdin needs it.

The service's exec knows argv, env and (unary) an output cap; it has no cwd, no
timeout and no process-tree kill of its own. So every command runs under
``WRAPPER``, a POSIX ``sh`` script, inside the sandbox:

- ``cd`` to the request's cwd (a cwd that does not exist exits 127);
- with ``exclusive``, every other process of the sandbox is SIGKILLed first (up to three
  sweeps of ``/proc``, so what forked meanwhile dies too), sparing PID 1 (immune anyway,
  see ``KEEPALIVE``), the wrapper and its ancestors (whatever carries its output);
- ``ulimit -t`` for the CPU budget (the request's or ``Resources.cpu_seconds``: SIGXCPU at the
  budget, SIGKILL a second later for a program that catches it), ``ulimit -f``
  for ``Resources.file_size_mib``;
- ``timeout -k K T`` (coreutils/busybox) for the wall timeout: it signals the command's
  whole process group, and the service then returns the output captured so far;
- on the unary path, each of stdout and stderr through ``head -c CAP+1``: once a stream
  passes the cap the command's next write gets SIGPIPE, so a flood ends at once. More
  than CAP bytes seen means ``truncated``; the client keeps CAP. On the streaming path
  the output goes straight to the service (``head`` buffers through stdio, which would
  hold streamed output back) and the client counts: past the cap it cancels the call,
  which ends the command.

Measured (benchmarks/bench_coreweave.py, one run): a unary ``Exec`` costs the client about
0.65x the CPU of a ``StreamExec`` round (ready, output, exit and the status complete one by
one), so ``exec_rpc="auto"`` uses unary unless the request has stdin or the caller streams
output, until the service answers ``UNIMPLEMENTED`` (the backend then stays on ``StreamExec``).
Until the channel has seen ``Exec`` answered either way, one exec at a time asks; the others of a
first burst take ``StreamExec`` meanwhile (so a burst of N costs one refused call, not N).
A stream without stdin goes out as the SDK sends it (init and half-close, in one batch here);
with stdin, the chunks and an ``ExecStreamClose`` follow.

Failure classes: a timeout is ``timed_out`` (the program's outcome), also when the
client deadline (timeout + ``exec_slack_seconds``) fires because something the program
left behind holds its output open; output over the cap, or a stream the service ended
with ``STREAM_BACKPRESSURE``/``STREAM_TRUNCATED`` because output outran it, is
``truncated``. A stream that ends without an exit status is diagnosed by the backend.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grpc.aio import EOF

from ..._types import ExecExit, ExecRequest, StreamName
from ..base import OutputCallback
from ._channel import Channel, RpcError

__all__ = ["KEEPALIVE", "WRAPPER", "ExecOutcome", "run_stream", "run_unary", "wrap"]

#: The sandbox's main process: ``sleep`` as PID 1 has no signal handlers, so nothing inside the
#: sandbox can signal it (the kernel drops such signals to a namespace's init) and a program
#: cannot end its own sandbox to turn its failure into an infrastructure error.
KEEPALIVE = ("/bin/sh", "-c", "exec sleep 2147483647")

WRAPPER = (
    'cd -- "$1" 2>/dev/null || { echo "cwsandbox: no directory $1" >&2; exit 127; }; '
    "t=$2; k=$3; n=$4; c=$5; f=$6; x=$7; shift 7; "
    # exclusive: SIGKILL every process but PID 1, this wrapper and its ancestors (shell builtins only)
    'if [ "$x" = 1 ]; then a=" 1 $$ "; p=$$; '
    'while [ "$p" -gt 1 ] && read -r _ _ _ p _ <"/proc/$p/stat"; do a="$a$p "; done 2>/dev/null; '
    "for r in 1 2 3; do k=0; for d in /proc/[0-9]*; do q=${d#/proc/}; "
    'case "$a" in *" $q "*) ;; *) kill -KILL "$q" 2>/dev/null && k=1;; esac; done; '
    '[ "$k" = 0 ] && break; done; fi; '
    '[ "$c" = 0 ] || { ulimit -S -t "$c" && ulimit -H -t $((c + 1)); } 2>/dev/null; '
    '[ "$f" = 0 ] || ulimit -f "$f" 2>/dev/null; '
    'if command -v timeout >/dev/null 2>&1; then set -- timeout -k "$k" "$t" "$@"; fi; '
    '[ "$n" = 0 ] && exec "$@"; '
    "exec 5>&1 6>&2; "
    's=$( { { { "$@" 5>&- 6>&- 7>&-; echo $? >&7; } | head -c "$n" >&5; } 2>&1 | head -c "$n" >&6; } 7>&1 ); '
    'exit "${s:-255}"'
)
STDIN_CHUNK = 64 * 1024
#: Exit statuses ``timeout`` gives when it fired (TERM worked / KILL was needed).
_TIMEOUT_CODES = (124, 128 + 9)


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def wrap(
    request: ExecRequest,
    kill_after: float,
    *,
    cpu_seconds: float | None = None,
    file_size_mib: int | None = None,
    cap_inside: bool = True,
) -> list[str]:
    """The argv that runs ``request`` under ``WRAPPER``; ``cpu_seconds``/``file_size_mib`` are the
    sandbox's per-process limits (``Resources``), combined with the request's CPU budget."""
    budgets = [b for b in (request.cpu_seconds, cpu_seconds) if b]
    cpu = math.ceil(min(budgets)) if budgets else 0
    blocks = file_size_mib * 2048 if file_size_mib else 0  # sh's ulimit -f counts 512-byte blocks
    cap = request.max_output_bytes + 1 if cap_inside else 0
    head = _head(request.cwd, request.timeout_seconds, kill_after, cap, cpu, blocks, request.exclusive)
    return [*head, *request.argv]


@functools.lru_cache(maxsize=256)
def _head(
    cwd: str, timeout: float, kill_after: float, cap: int, cpu: int, blocks: int, exclusive: bool
) -> tuple[str, ...]:
    """``WRAPPER``'s argv before the command (the same for most execs of a run: built once)."""
    limits = (_seconds(timeout), _seconds(kill_after), str(cap), str(cpu), str(blocks), "1" if exclusive else "0")
    return ("/bin/sh", "-c", WRAPPER, "cwsandbox", cwd, *limits)


@dataclass
class ExecOutcome:
    """What came back from one exec call, before it is judged."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit_code: int | None = None
    deadline_hit: bool = False
    truncated: bool = False
    #: The call failed (the backend diagnoses it; partial output above is kept).
    error: RpcError | None = None
    #: A frame arrived (the command started), so re-sending would run it twice.
    started: bool = False
    stream_error: tuple[str, str] | None = None

    def judge(self, request: ExecRequest, wall: float) -> ExecExit:
        """The ``ExecExit`` for a call that ended with an exit status or hit its deadline."""
        cap = request.max_output_bytes
        truncated = self.truncated or len(self.stdout) > cap or len(self.stderr) > cap
        out, err = bytes(self.stdout[:cap]), bytes(self.stderr[:cap])
        if self.deadline_hit or self.exit_code is None:
            # no exit status: the client's deadline fired, or it stopped reading at the cap
            timed_out = self.deadline_hit or not truncated
            return ExecExit(-9, out, err, wall, timed_out=timed_out, truncated=truncated)
        rc = self.exit_code
        timed_out = rc in _TIMEOUT_CODES and wall >= request.timeout_seconds
        cpu_exceeded = bool(request.cpu_seconds) and rc == 128 + 24  # SIGXCPU from ulimit -t
        if timed_out:
            rc = -15 if rc == 124 else -9
        elif rc > 128 and (truncated or cpu_exceeded):
            rc = 128 - rc  # killed by that signal (SIGPIPE at the cap, SIGXCPU)
        return ExecExit(rc, out, err, wall, timed_out=timed_out, truncated=truncated, cpu_exceeded=cpu_exceeded)


def _failed(out: ExecOutcome, exc: RpcError) -> None:
    """Record a failed exec RPC: our own deadline passing is the command's timeout, anything else an error."""
    if exc.failure.code.name == "DEADLINE_EXCEEDED" and exc.failure.reason is None:
        out.deadline_hit = True
    else:
        out.error = exc


def _deadline(request: ExecRequest, slack: float) -> float:
    return request.timeout_seconds + slack


async def run_unary(
    channel: Channel, service_id: str, request: ExecRequest, argv: Sequence[str], slack: float
) -> ExecOutcome:
    """One ``Exec`` call. The service caps each stream at ``max_output_bytes + 1`` too."""
    from cwsandbox._proto import sandbox_pb2

    out = ExecOutcome()
    msg = sandbox_pb2.ExecRequest(
        sandbox_id=service_id, command=argv, env=dict(request.env), max_output_bytes=request.max_output_bytes + 1
    )
    try:
        resp = await channel.unary("Exec", msg, deadline=_deadline(request, slack), idempotent=False)
    except RpcError as exc:
        _failed(out, exc)
        return out
    out.stdout += resp.stdout
    out.stderr += resp.stderr
    out.truncated = resp.stdout_truncated or resp.stderr_truncated
    out.exit_code = resp.exit_code
    out.started = True
    return out


async def run_stream(
    channel: Channel,
    service_id: str,
    request: ExecRequest,
    argv: Sequence[str],
    slack: float,
    on_output: OutputCallback | None,
) -> ExecOutcome:
    """One ``StreamExec`` call, as the SDK makes it: init, then stdin in 64 KiB chunks and an
    ``ExecStreamClose`` if there is stdin, then the half-close; output as it comes, up to the
    exit frame (or an in-band error), which ends the call."""
    from cwsandbox._proto import sandbox_pb2

    out = ExecOutcome()
    cap = request.max_output_bytes
    stdout_kind = sandbox_pb2.ExecStreamOutput.STREAM_STDOUT
    Request = sandbox_pb2.ExecStreamRequest
    init_fields = sandbox_pb2.ExecStreamInit(sandbox_id=service_id, command=argv)
    if request.env:
        init_fields.env.update(request.env)
    init = Request(init=init_fields)
    stdin = request.stdin

    async def body(call: Any) -> None:
        if stdin:
            await call.write(init)
            for i in range(0, len(stdin), STDIN_CHUNK):
                await call.write(Request(stdin=stdin[i : i + STDIN_CHUNK]))
            await call.write(Request(close=sandbox_pb2.ExecStreamClose()))
            await call.done_writing()
        stdout, stderr = out.stdout, out.stderr
        while (resp := await call.read()) is not EOF:
            out.started = True
            kind = resp.WhichOneof("message")
            if kind == "output":
                output = resp.output
                name: StreamName = "stdout" if output.stream == stdout_kind else "stderr"
                buf = stdout if name == "stdout" else stderr
                data = output.data
                room = cap - len(buf)
                if on_output is not None and room > 0 and data:
                    await on_output(name, data[:room] if room < len(data) else data)
                buf += data[: cap + 1 - len(buf)]
                if len(buf) > cap:
                    out.truncated = True
                    return  # ending the call (cancelled) ends the command
            elif kind == "exit":
                out.exit_code = resp.exit.exit_code
                return
            elif kind == "error":
                out.stream_error = (resp.error.code, resp.error.message)
                if resp.error.code in ("STREAM_BACKPRESSURE", "STREAM_TRUNCATED"):
                    out.truncated = True
                    if out.exit_code is None:
                        out.exit_code = 128 + 9  # the service ended the command's output
                return

    try:
        deadline = _deadline(request, slack)
        await channel.exchange("StreamExec", body, deadline=deadline, only=None if stdin else init)
    except RpcError as exc:
        _failed(out, exc)
    return out
