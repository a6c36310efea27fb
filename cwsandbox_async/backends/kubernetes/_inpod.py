"""The small shell programs the backend runs inside a pod, and how their argv is built.

A real kubelet does not kill an exec's process when its stream closes (kubernetes#89031,
kubectl#1076), so an exec the backend abandons (cancelled, timed out, cut at the output
cap, a broken stream) would run on in the pod, and in a pooled pod into the next lease.
So every command runs in a session of its own, and the backend can kill that session:

- ``SESSION`` (the argv prefix of every exec, file reads and writes included) first waits
  for the client's ``GO`` line on stdin, so an exec cancelled before its stream was up never
  starts its command (the socket closes, stdin ends, the wrapper exits); then it makes the
  command a session leader with ``setsid`` and prints the session id as the first line of
  stderr *before* the command starts, so the command cannot forge or suppress it. The
  backend strips that line (``SessionHeader``). The wrapper's own shell stays, as the session
  leader's parent, with a token the backend chose as its ``$0`` (``cwsandbox-<token>``): a
  stream that breaks before the backend has read the session id can still be killed by it.
- ``KILL`` (``kill_argv``) is the follow-up exec that kills the session: every process
  whose session or process group is that id, and their descendants, repeated until none
  is left. ``KILL_TOKEN`` (``kill_token_argv``) does the same for the children of the
  wrapper that carries a token, and kills the wrapper. A process that leaves the session
  *and* its parent (``setsid`` after a double fork) escapes it; ``ExecRequest.exclusive``
  (every other process killed before a
  command starts) and destroying the pod close that gap.
- ``EXEC`` runs a user command: cd, export env, kill every other process when exclusive,
  ``ulimit -t`` for a CPU budget, ``timeout -k`` for the wall timeout (it signals the
  command's process group), and stdin ended after exactly N bytes (EOF on v4 too).

The image needs ``sh``; ``setsid`` (util-linux or busybox) and ``timeout`` are used when
present (without ``setsid`` the kill follows the process tree only).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

__all__ = [
    "EXEC",
    "GO",
    "KILL",
    "KILL_TOKEN",
    "SESSION",
    "SessionHeader",
    "exec_argv",
    "in_session",
    "kill_argv",
    "kill_token_argv",
    "session_token",
]

#: The first stdin bytes of a ``SESSION`` command: the client is there and will read the output.
GO = b"go\n"

#: Kill processes until none is left: ``cws_reap session ID`` (session/group ID and descendants)
#: or ``cws_reap others`` (everything but PID 1, this shell and its parent). Zombies are skipped;
#: a process that cannot be signalled is not retried. Returns 1 if processes kept appearing.
#: ``others`` kills PID 1's idle ``sleep`` (``IDLE_SCRIPT``) too, and PID 1 starts another at once:
#: after the first round, a child of PID 1 whose executable is the image's ``sleep`` and whose name is
#: ``sleep`` (busybox picks the applet by that name) is that new one, not a leftover (every process
#: that existed was killed in the first round, and neither can be forged without *being* sleep).
#: Counting it made every exclusive exec spend 50 rounds (a second) before it started.
_REAP = (
    'cws_reap() { m=$1 k=$2 keep=" 1 $$ $PPID " r=0 z=; '
    'while [ "$r" -lt 50 ]; do f=; '
    "for d in /proc/[0-9]*; do p=${d#/proc/}; "
    'case "$keep" in *" $p "*) continue;; esac; '
    'read -r s 2>/dev/null < "$d/stat" || continue; '
    "set -- ${s##*) }; "  # state ppid pgrp session ...
    '[ "$1" = Z ] && continue; '
    'if [ "$m" = others ]; then '
    '[ "$r" -gt 0 ] && [ "$2" = 1 ] && { [ -n "$z" ] || z=$(command -v sleep) || z=/; } '
    '&& [ "$d/exe" -ef "$z" ] && read -r n 2>/dev/null < "$d/comm" '
    '&& [ "$n" = sleep ] && continue; '
    'kill -9 "$p" 2>/dev/null && f="$f $p"; continue; fi; '
    'case " $k $f " in *" $p "*|*" $2 "*|*" $3 "*|*" $4 "*) kill -9 "$p" 2>/dev/null && f="$f $p";; esac; '
    "done; "
    '[ -n "$f" ] || return 0; r=$((r + 1)); sleep 0.02 2>/dev/null || sleep 1; '
    "done; return 1; }; "
)

#: Prefix (``$0``: ``cwsandbox-<token>``): wait for the client's ``GO`` line on stdin (a stream
#: that closes before it, e.g. an exec cancelled during its upgrade, starts nothing), then run the
#: script "$1" (its arguments: the rest) as a session leader whose id is the first line of stderr,
#: from a background job (``setsid`` forks when its caller leads a process group; a background job
#: does not), and wait for it: this shell stays, carrying the token (``KILL_TOKEN``). Without
#: ``setsid`` the script runs here, announcing this pid.
SESSION = (
    'read -r g && [ "$g" = go ] || exit 125; '
    'c=$1; shift; h=\'printf "%s\\n" "$$" >&2; \'; '
    'command -v setsid >/dev/null 2>&1 || { eval "$h"; eval "$c"; exit; }; '
    'exec 3<&0; setsid /bin/sh -c "$h$c" cwsandbox "$@" <&3 3<&- & wait $!'
)

#: Arguments: cwd, env count, timeout, kill grace, cpu seconds (0: none), stdin bytes, exclusive
#: (0/1), the ``K=V`` pairs, then the argv. A cwd that does not exist exits 127.
EXEC = (
    _REAP + 'cd -- "$1" || exit 127; n=$2; t=$3; g=$4; c=$5; i=$6; x=$7; shift 7; '
    'while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n - 1)); done; '
    '[ "$x" = 0 ] || cws_reap others; '
    '[ "$c" = 0 ] || ulimit -t "$c" 2>/dev/null; '
    'if command -v timeout >/dev/null 2>&1; then set -- timeout -k "$g" "$t" "$@"; fi; '
    'if [ "$i" = 0 ]; then exec "$@" </dev/null; fi; '
    'head -c "$i" | "$@"'
)

#: Argument: the session id to kill.
KILL = _REAP + 'cws_reap session "$1"'

#: Argument: the token of an ``in_session`` wrapper. Finds the wrappers whose argv carries
#: ``cwsandbox-<token>`` (this script's own argv has the bare token), takes their children (the
#: session leaders: the session id is the leader's pid, announced or not), kills the wrappers, then
#: each leader's session as ``KILL`` does.
KILL_TOKEN = _REAP + (
    't=$1 o= s=; for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = "$$" ] && continue; '
    'c=$(tr "\\0" " " < "$d/cmdline" 2>/dev/null) || continue; '
    'case " $c" in *" cwsandbox-$t "*) o="$o $p";; esac; done; '
    '[ -n "$o" ] || exit 0; '
    'for d in /proc/[0-9]*; do read -r st 2>/dev/null < "$d/stat" || continue; set -- ${st##*) }; '
    'case " $o " in *" $2 "*) s="$s ${d#/proc/}";; esac; done; '
    'for p in $o; do kill -9 "$p" 2>/dev/null; done; '
    'for x in $s; do cws_reap session "$x"; done'
)


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def in_session(script: str, *args: str) -> list[str]:
    """The shell ``script`` (with ``args`` as "$@") run as the leader of a new session that announces its
    id (see ``SessionHeader``)."""
    return ["/bin/sh", "-c", SESSION, f"cwsandbox-{secrets.token_hex(8)}", script, *args]


def session_token(argv: Sequence[str]) -> str | None:
    """The token of an ``in_session`` argv (None for any other argv)."""
    if len(argv) > 3 and list(argv[:3]) == ["/bin/sh", "-c", SESSION] and argv[3].startswith("cwsandbox-"):
        return argv[3].removeprefix("cwsandbox-")
    return None


def exec_argv(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout: float,
    kill_grace: float,
    cpu_seconds: int | None,
    stdin_len: int,
    exclusive: bool,
) -> list[str]:
    """The argv that runs a user's command under ``EXEC``, in a session of its own."""
    pairs = [f"{k}={v}" for k, v in env.items()]
    head = [cwd, str(len(pairs)), _seconds(timeout), _seconds(kill_grace), str(cpu_seconds or 0), str(stdin_len)]
    return in_session(EXEC, *head, "1" if exclusive else "0", *pairs, *argv)


def kill_argv(session: int) -> list[str]:
    return ["/bin/sh", "-c", KILL, "cwsandbox-kill", str(session)]


def kill_token_argv(token: str) -> list[str]:
    return ["/bin/sh", "-c", KILL_TOKEN, "cwsandbox-kill", token]


class SessionHeader:
    """Splits the session id line off the front of stderr; ``feed`` returns the bytes that follow it.

    If the first line is not a session id (the wrapper could not run at all), nothing is
    stripped and ``session`` stays None.
    """

    MAX = 24

    def __init__(self) -> None:
        self.session: int | None = None
        self.done = False
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return data
        self._buf += data
        line, nl, rest = self._buf.partition(b"\n")
        if nl and line.isdigit() and int(line) > 1:
            self.session, self.done = int(line), True
            return rest
        if nl or len(self._buf) > self.MAX or not line.isdigit():
            self.done = True
            out, self._buf = self._buf, b""
            return out
        return b""
