"""The framing shared by the client and the sandbox agent (stdlib only).

This file is also prepended to the agent's source and run inside the sandbox,
so it must import nothing outside the standard library.

A frame is a 9-byte header, ``>IBI`` = (request id, type, payload length),
followed by the payload. Request ids are chosen by the client; id 0 is the
agent's own (the hello frame). Structured payloads are ``u32 json length +
JSON + raw bytes`` (see ``pack_meta``/``unpack_meta``), so bulk data (stdin,
file contents, output chunks) is never encoded as JSON.

Client -> agent:

- ``EXEC``  meta ``{"a": argv, "c": cwd, "e": env, "t": timeout, "m": max_output}`` + stdin bytes
- ``PY``    the same meta plus ``"n"`` (stdin length); raw = stdin + Python source (UTF-8)
- ``KILL``  empty; cancels the exec with that id (its process group is killed)
- ``READ``  meta ``{"p": path, "m": max_bytes}``
- ``WRITE`` meta ``{"p": path}`` + file contents
- ``PING``  empty
- ``EXIT``  empty; the agent kills everything and exits

Agent -> client:

- ``OUT`` / ``ERR`` an output chunk of that exec (raw bytes)
- ``DONE``  meta ``{"rc", "w" (wall s), "u" (cpu s), "to" (timed out), "tr" (truncated)}``
- ``DATA``  a file's contents (raw)
- ``OK``    empty (write done, pong)
- ``FAIL``  meta ``{"k": kind, "m": message}``; kinds: ``file``, ``invalid``, ``internal``
- ``HELLO`` (id 0) meta ``{"pid", "python", "limits"}``, once, when the agent is ready
"""

from __future__ import annotations

import json
import struct

TYPE_CHECKING = False  # typing is not imported at run time: the agent starts faster without it
if TYPE_CHECKING:
    from typing import Any

#: The agent's first program (``python3 -I -c BOOTSTRAP cwsandbox-agent <sandbox id> [fd]``): read
#: ``u32 source length, u32 config length, source, config`` from fd 0 (or the fd given), then run
#: the source (or its marshaled code, see ``MARSHALED``) as ``__main__`` with
#: ``sys.argv = ["cwsandbox-agent", config]``.
BOOTSTRAP = """import os,sys
fd=int(sys.argv[3]) if len(sys.argv)>3 else 0
def r(n):
    b=bytearray()
    while len(b)<n:
        c=os.read(fd,n-len(b))
        if not c:raise SystemExit(70)
        b+=c
    return bytes(b)
h=r(8)
s=int.from_bytes(h[:4],'big');c=int.from_bytes(h[4:],'big')
src=r(s);sys.argv=['cwsandbox-agent',r(c).decode()]
if fd:os.close(fd)
m=src[:8]==MARSHALED
code=__import__('marshal').loads(src[8:]) if m else compile(src,'<cwsandbox-agent>','exec')
exec(code,{'__name__':'__main__','__agent_source__':src})
""".replace("MARSHALED", repr(b"\x00marshal"))
#: Prefix of an agent source sent pre-compiled (``marshal``), when the sandbox's Python matches ours.
MARSHALED = b"\x00marshal"

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


def boot_payload(source: bytes, config: bytes) -> bytes:
    """What BOOTSTRAP reads: the agent's source and its JSON configuration, length-prefixed."""
    return len(source).to_bytes(4, "big") + len(config).to_bytes(4, "big") + source + config


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
