"""Finding out, once per process, which isolation actually works on this machine.

``probe`` runs tiny real sandboxes: bwrap with the full layout running the agent's
interpreter (first as an unprivileged host uid when the driver is root, then as
the driver's own uid), else ``unshare``, and reports the first that works. When
the interpreter cannot run inside (and ``agent`` allows it), bwrap with a plain
``/bin/sh`` is the fallback: the plain exec path (``_plain``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import anyio

from ..._errors import SandboxBackendUnavailableError
from ..._log import log
from ._bwrap import Layout, bwrap_argv, parse_features, pick_host_uid, unshare_argv

__all__ = ["Probe", "ProbeRequest", "probe", "run_quiet"]

MIB = 1024 * 1024


@dataclass(frozen=True)
class Probe:
    """The isolation in use: ``level`` (bwrap, unshare, none), and how."""

    level: str
    bwrap: str | None = None
    features: frozenset[str] = frozenset()
    drop_uid: bool = False
    plain: bool = False
    #: ``importlib.util.MAGIC_NUMBER`` (hex) of the sandbox's Python, to send the agent pre-compiled.
    magic: str = ""


@dataclass(frozen=True)
class ProbeRequest:
    requested: str  # auto, bwrap, unshare, none
    agent: str  # auto, python, plain
    bwrap: str | None
    unshare: str | None
    host_uid: int | str | None
    python: str
    python_prefix: str | None
    uid: int
    gid: int


async def run_quiet(argv: list[str], uid: int | None, within: float = 30.0) -> tuple[int, str]:
    """Run a short command (as ``uid`` if given); its exit code and combined output. Never raises."""
    kwargs: dict[str, object] = {}
    if uid is not None:
        kwargs = {"user": uid, "group": uid, "extra_groups": []}
    try:
        with anyio.fail_after(within):
            proc = await anyio.run_process(argv, check=False, cwd="/", env={"PATH": "/usr/bin:/bin"}, **kwargs)  # type: ignore[arg-type]
    except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
        return 1, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).decode("utf-8", "replace")


async def _try_bwrap(req: ProbeRequest, features: frozenset[str], drop: bool, command: list[str]) -> tuple[int, str]:
    assert req.bwrap is not None
    layout = Layout(
        hostname="cwsandbox-probe",
        working_dir="/workspace",
        tmp_bytes=MIB,
        workspace_bytes=MIB,
        network=False,
        uid=req.uid,
        gid=req.gid,
        python_prefix=req.python_prefix,
    )
    rc, out = await run_quiet(
        bwrap_argv(req.bwrap, features, layout, command), pick_host_uid(req.host_uid) if drop else None
    )
    if rc == 0 and out.split()[:1] != [str(req.uid)]:
        return 1, f"unexpected uid inside the sandbox: {out.strip()!r}"
    return rc, out


async def probe(req: ProbeRequest) -> Probe:
    """The first isolation that works here; ``SandboxBackendUnavailableError`` (with every reason) if none does."""
    if req.requested == "none":
        return Probe("none")
    errors: list[str] = []
    drops = [True, False] if pick_host_uid(req.host_uid) is not None else [False]
    python_cmd = [
        req.python,
        "-I",
        "-S",
        "-c",
        "import os, importlib.util as u; print(os.getuid(), u.MAGIC_NUMBER.hex())",
    ]
    if req.requested in ("auto", "bwrap") and req.bwrap is not None:
        features = parse_features((await run_quiet([req.bwrap, "--help"], None))[1])
        for drop in drops:
            if req.agent in ("auto", "python"):
                rc, out = await _try_bwrap(req, features, drop, python_cmd)
                if rc == 0:
                    return _chosen(Probe("bwrap", req.bwrap, features, drop, magic=out.split()[-1]), drops)
                errors.append(f"bwrap{' as an unprivileged uid' if drop else ''}: {out.strip()[-300:]}")
            if req.agent in ("auto", "plain"):
                rc, out = await _try_bwrap(req, features, drop, ["/bin/sh", "-c", "id -u"])
                if rc == 0:
                    if req.agent == "auto":
                        log.warning("no Python runs inside the sandbox; using the plain exec path", python=req.python)
                    return _chosen(Probe("bwrap", req.bwrap, features, drop, plain=True), drops)
                errors.append(f"bwrap with /bin/sh: {out.strip()[-300:]}")
    if req.requested in ("auto", "unshare") and req.unshare is not None and req.agent != "plain":
        for drop in drops:
            argv = unshare_argv(req.unshare, False, python_cmd)
            rc, out = await run_quiet(argv, pick_host_uid(req.host_uid) if drop else None)
            if rc == 0 and out.split()[:1] == ["0"]:
                return _chosen(Probe("unshare", None, frozenset(), drop, magic=out.split()[-1]), drops)
            errors.append(f"unshare{' as an unprivileged uid' if drop else ''}: {out.strip()[-300:]}")
    raise SandboxBackendUnavailableError("no working isolation on this machine: " + " | ".join(errors))


def _chosen(result: Probe, drops: list[bool]) -> Probe:
    if not result.drop_uid and drops == [True, False]:
        log.warning(
            "sandboxes cannot run as an unprivileged host uid here; their user maps to host root",
            level=result.level,
        )
    return result
