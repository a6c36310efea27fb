"""What the driver sends a host agent at its boot: the bootstrap, the agent package, its configuration.

Only the boot: the protocol the agent then speaks lives in ``agent.protocol`` (shared with the
driver's ``_channel``). Template-born sandboxes import the agent package from the template instead
(``agent/_birth``). A host agent (``isolation="none"``, see ``host``) is started as
``python3 -I -c BOOTSTRAP cwsandbox-agent <sandbox id> [fd]``.
``BOOTSTRAP`` reads ``u32 bundle length, u32 config length, bundle, config`` from
fd 0 (or the fd given), installs a finder that serves the modules of the bundle
(``agent_bundle``: a marshaled ``{module name: (is package, code object or
source)}``, code objects only when the sandbox's Python has our bytecode magic),
imports ``cwsandbox_agent.main`` from it and calls ``main.boot(config, bundle)``.
A truncated payload exits with status 70 before anything runs.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["AGENT_PACKAGE", "BOOTSTRAP", "agent_bundle", "boot_payload"]

#: The agent package's name inside a sandbox.
AGENT_PACKAGE = "cwsandbox_agent"
BOOTSTRAP = """import os,sys,marshal
fd=int(sys.argv[3]) if len(sys.argv)>3 else 0
def r(n):
    b=bytearray()
    while len(b)<n:
        c=os.read(fd,n-len(b))
        if not c:raise SystemExit(70)
        b+=c
    return bytes(b)
h=r(8)
b=r(int.from_bytes(h[:4],'big'));g=r(int.from_bytes(h[4:],'big'))
if fd:os.close(fd)
m=marshal.loads(b)
S=type(sys.__spec__)
class L:
    def create_module(s,p):return None
    def exec_module(s,o):
        k=m[o.__name__][1]
        exec(k if type(k) is not str else compile(k,o.__name__,'exec'),o.__dict__)
class F:
    def find_spec(s,n,p=None,t=None):
        e=m.get(n)
        return None if e is None else S(n,L(),is_package=e[0])
sys.meta_path.insert(0,F())
__import__('PACKAGE.main').main.boot(g,b)
""".replace("PACKAGE", AGENT_PACKAGE)


@lru_cache(maxsize=4)
def agent_bundle(magic: str) -> bytes:
    """The agent package as BOOTSTRAP loads it; compiled when ``magic`` (hex) is our bytecode magic."""
    here = Path(__file__).resolve().parent.parent / "agent"
    compiled = bool(magic) and magic == importlib.util.MAGIC_NUMBER.hex()
    modules: dict[str, tuple[bool, Any]] = {}
    for path in sorted(here.glob("*.py")):
        is_package = path.stem == "__init__"
        name = AGENT_PACKAGE if is_package else f"{AGENT_PACKAGE}.{path.stem}"
        source = path.read_text()
        filename = f"{AGENT_PACKAGE}/{path.name}"
        modules[name] = (is_package, compile(source, filename, "exec", dont_inherit=True) if compiled else source)
    return marshal.dumps(modules)


def boot_payload(bundle: bytes, config: dict[str, Any]) -> bytes:
    """What BOOTSTRAP reads: the agent package and its JSON configuration, length-prefixed."""
    encoded = json.dumps(config, separators=(",", ":")).encode()
    return len(bundle).to_bytes(4, "big") + len(encoded).to_bytes(4, "big") + bundle + encoded
