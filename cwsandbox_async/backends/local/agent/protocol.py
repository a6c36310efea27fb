"""The framed protocol between the driver and the sandbox agent (stdlib only; both sides import it).

A frame is a 9-byte header, ``>IBI`` = (request id, type, payload length),
followed by the payload. Request ids are chosen by the client; id 0 is the
agent's own (the hello frame). Structured payloads are ``u32 json length +
JSON + raw bytes`` (see ``pack_meta``/``unpack_meta``), so bulk data (stdin,
file contents, output chunks) is never encoded as JSON.

Client -> agent:

- ``EXEC``  meta ``{"a": argv, "c": cwd, "e": env, "t": timeout, "m": max_output,
  "b": cpu budget (s) or null, "x": exclusive}`` + stdin bytes
- ``PY``    the same meta plus ``"n"`` (stdin length); raw = stdin + Python source (UTF-8)
- ``KILL``  empty; cancels the exec with that id (its process tree is killed)
- ``READ``  meta ``{"p": path, "m": max_bytes}``
- ``WRITE`` meta ``{"p": path}`` + file contents
- ``PING``  empty
- ``EXIT``  empty; the agent kills everything and exits

Agent -> client:

- ``OUT`` / ``ERR`` an output chunk of that exec (raw bytes)
- ``DONE``  meta ``{"rc", "w" (wall s), "u" (cpu s), "to" (timed out), "tr" (truncated),
  "oom" (OOM-killed), "cx" (CPU budget exceeded), "cw" (run-queue wait s, or null),
  "sc" (CPU s of everything in the sandbox meanwhile, or null)}``
- ``DATA``  a file's contents (raw)
- ``OK``    empty (write done, pong)
- ``FAIL``  meta ``{"k": kind, "m": message}``; kinds: ``file``, ``invalid``, ``internal``
- ``HELLO`` (id 0) meta ``{"pid", "python", "subreaper", "template", "workers", "hardening"}``,
  once, when the agent is ready
"""

from __future__ import annotations

import json
import struct

TYPE_CHECKING = False  # typing is not imported at run time: the agent starts faster without it
if TYPE_CHECKING:
    from typing import Any

HEADER = struct.Struct(">IBI")
META_LEN = struct.Struct(">I")
#: Largest payload either side accepts (a 256 MiB file plus its metadata).
MAX_PAYLOAD = 256 * 1024 * 1024 + 1024 * 1024

T_EXEC = 1
T_PY = 2
T_KILL = 3
T_READ = 4
T_WRITE = 5
T_PING = 6
T_EXIT = 7

R_OUT = 16
R_ERR = 17
R_DONE = 18
R_DATA = 19
R_OK = 20
R_FAIL = 21
R_HELLO = 22

#: Exit code of a command that could not be started (not executable, no such directory, no process).
SPAWN_FAILED = 126
#: Exit code of a command that was not found.
NOT_FOUND = 127


def pack_frame(rid: int, ftype: int, payload: bytes = b"") -> bytes:
    """One frame: header and payload."""
    return HEADER.pack(rid, ftype, len(payload)) + payload


def pack_meta(meta: object, raw: bytes = b"") -> bytes:
    """A structured payload: JSON metadata followed by raw bytes."""
    encoded = json.dumps(meta, separators=(",", ":")).encode()
    return META_LEN.pack(len(encoded)) + encoded + raw


def unpack_meta(payload: bytes) -> tuple[dict[str, Any], bytes]:
    """Split a structured payload; raises ``ValueError`` when it is malformed."""
    if len(payload) < META_LEN.size:
        raise ValueError("payload too short for its metadata length")
    (n,) = META_LEN.unpack_from(payload)
    end = META_LEN.size + n
    if end > len(payload):
        raise ValueError("metadata longer than the payload")
    meta = json.loads(payload[META_LEN.size : end])
    if not isinstance(meta, dict):
        raise ValueError("metadata is not an object")
    return meta, payload[end:]
