"""A newborn's root from an image: an overlay of the image's layers and a private upper (stdlib only).

Called by the newborn, N (see ``_birth``), right after it entered its own mount namespace and while it
is still uid 0 of the template's user namespace, before it enters the sandbox's: so every mount made
here is owned by the template's namespace and is locked in the sandbox's copy of it (nothing inside
can unmount one to see what is below, nor mount anything).

1. A fresh tmpfs at ``STAGE`` (a mount point of the template's root), of ``upper_bytes`` (the
   sandbox's ``workspace_mib``; None: no size limit): everything the sandbox writes to its root lands
   there, counted in that size and in the memory cgroup of the process that writes it. It is
   N's own: it goes with the sandbox's mount namespace, so nothing is left on disk, whatever happens.
2. An overlay (``userxattr``: whiteouts and opaque directories readable without privilege) of the
   image's layers, read-only lowers from the template's ``LAYERS`` mount (the image cache's unpacked
   layers, shared by every sandbox of every image: disk once), with the upper and work directories
   on that tmpfs. The upper's root is the sandbox's uid (``owner``), so the image's ``/`` is its.
3. Mount points in it (made in the upper when the image has none: an image needs no ``/proc``,
   ``/dev`` or ``/run``), and what the sandbox needs from the template's root: ``/dev`` and ``/sys``
   (recursive binds, read-only as in the template), the agent package, the native spawner and the
   agent interpreter's standard library (``PYTHON_ROOT``, for ``run_python``'s imports): the agent
   needs nothing from the image; and the sandbox's ``/proc``.
4. ``pivot_root`` into it; the template's root (and the layer cache in it) is hidden below an
   empty, locked tmpfs (``_move_into``): nothing in the sandbox reaches the template's view, the
   layer cache or any other image.

Failures raise ``OSError``; N prints them and exits (the driver's ``SandboxCreationError``).
"""

from __future__ import annotations

import os
import sys

from . import _rootfs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Where the template's root holds the image cache's unpacked layers (``layers/`` of the cache).
LAYERS = "/.cwsandbox-layers"
#: The mount point of a newborn's upper tmpfs in the template's root.
STAGE = "/.cwsandbox-stage"
#: Where the agent interpreter's standard library directories are bound in an image sandbox.
PYTHON_ROOT = _rootfs.AGENT_ROOT + "/python"
#: The bottom lower of every image root (``skeleton``): the mount points, so that a birth makes none.
SKELETON = "/.cwsandbox-skeleton"
#: Where the template's root stays after the pivot, below an empty, read-only, locked tmpfs.
OLD_ROOT = _rootfs.AGENT_ROOT + "/template"
#: Legacy ``mount(2)`` options are one page: the lower list (relative names, 65 bytes per layer) fits ~60.
MAX_OPTIONS = 4095


def skeleton(spawner: str | None) -> None:
    """The template, once: ``SKELETON``, every mount point an image root needs, as a directory tree in
    its root, which each image root has as its bottom layer (an image's own directories win, with
    their owners; one it lacks comes from here, the template's, read-only to the sandbox). Making
    them in each sandbox's upper took a dozen overlay copy-ups per birth."""
    from . import harden

    points = ["/proc", "/dev", "/sys", harden.HOME, _rootfs.AGENT_ROOT + "/" + _rootfs.AGENT_PACKAGE, OLD_ROOT]
    points += [f"{PYTHON_ROOT}/{i}" for i in range(len(_python_paths()))]
    for path in points:
        os.makedirs(SKELETON + path, mode=0o755, exist_ok=True)
    os.makedirs(SKELETON + "/tmp", exist_ok=True)
    os.chmod(SKELETON + "/tmp", 0o1777)
    if spawner:
        os.makedirs(os.path.dirname(SKELETON + spawner), exist_ok=True)
        os.close(os.open(SKELETON + spawner, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o755))


def hide_layers() -> None:
    """A sandbox of the host's root view: the layer cache goes below an empty, read-only tmpfs (``_hide``)."""
    _hide(LAYERS)


def _hide(path: str) -> None:
    """Mount an empty, read-only tmpfs over ``path``, in N's mount namespace before the sandbox's user
    namespace copies it: the copy locks it there (no unmount inside can reveal what is below, whatever
    the capabilities), and no path leads below a mount; ``mountinfo`` still names what is below.

    Not ``umount2``: detaching a mount from the newborn's copy of the template's namespace waits for
    RCU grace periods, 7-10 ms per birth on a loaded 2-core machine (a third of a create); a mount
    does not."""
    flags = _rootfs.MS_RDONLY | _rootfs.MS_NOSUID | _rootfs.MS_NODEV | _rootfs.MS_NOEXEC
    _rootfs.mount("tmpfs", path, "tmpfs", flags, "size=4096,mode=0")


def build(image: dict[str, Any], owner: int, spawner: str | None) -> None:
    """Make the image root and move into it (see the module docstring). ``image``: ``layers`` (names
    under ``LAYERS``, top first), ``upper_bytes``, ``mkdirs`` (the working directory); ``owner``: the
    sandbox's uid in the template's namespace."""
    upper_bytes = image.get("upper_bytes")
    _rootfs.tmpfs(STAGE, int(upper_bytes) if upper_bytes else None, 0o755)
    upper, work, root = STAGE + "/upper", STAGE + "/work", STAGE + "/root"
    for path in (upper, work, root):
        os.mkdir(path)
    os.chown(upper, owner, owner)
    lowers = ":".join([*(str(name) for name in image["layers"]), SKELETON])
    options = f"userxattr,lowerdir={lowers},upperdir={upper},workdir={work}"
    if len(options) > MAX_OPTIONS:
        raise OSError(0, f"the image has too many layers to mount ({len(image['layers'])})")
    try:
        os.chdir(LAYERS)  # the lowers by relative name: more of them fit in one page of options
    except PermissionError as exc:  # a root driver whose kernel refused the idmapped layers (template's stderr)
        raise OSError(exc.errno, "the image layers are not readable in the sandbox (no idmapped mount)") from None
    try:
        _rootfs.mount("overlay", root, "overlay", _rootfs.MS_NOSUID | _rootfs.MS_NODEV, options)
    finally:
        os.chdir("/")
    _mount_points(root, image, owner)
    # The sandbox's /proc, here: the kernel lets a user namespace mount a proc only where one is fully
    # visible already (the template's, gone after the pivot).
    _rootfs.mount("proc", root + "/proc", "proc", _rootfs.MS_NOSUID | _rootfs.MS_NODEV | _rootfs.MS_NOEXEC)
    _bind_recursive("/dev", root + "/dev")
    _bind_recursive("/sys", root + "/sys")
    _bind(_rootfs.AGENT_ROOT + "/" + _rootfs.AGENT_PACKAGE, root + _rootfs.AGENT_ROOT + "/" + _rootfs.AGENT_PACKAGE)
    if spawner and os.path.exists(spawner):
        _file(root + spawner, owner)
        _bind(spawner, root + spawner)
    paths = _python_paths()
    for index, path in enumerate(paths):
        target = f"{root}{PYTHON_ROOT}/{index}"
        _dirs(target, owner)
        _bind(path, target)
    _move_into(root, owner)
    # The agent imports (``run_python``'s ``import json``) from the host's standard library, bound above.
    # New entries get new finders; the template's stay cached, untouched (clearing them decrefs every name
    # they cached: 0.3 MiB of pages shared with the template made private in each sandbox).
    sys.path[:] = [_rootfs.AGENT_ROOT, *(f"{PYTHON_ROOT}/{i}" for i in range(len(paths)))]


def _move_into(root: str, owner: int) -> None:
    """``pivot_root`` into ``root``, the template's root (the layer cache with it) kept at ``OLD_ROOT``
    and hidden there (``_hide``), not detached: that ``umount2`` took 6-9 ms per birth."""
    _dirs(root + OLD_ROOT, owner)
    os.chdir(root)
    number = _rootfs._SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"pivot_root: unsupported architecture {os.uname().machine}")
    _rootfs.check(_rootfs.libc.syscall(number, b".", ("." + OLD_ROOT).encode()), "pivot_root")
    os.chdir("/")
    _hide(OLD_ROOT)


def _python_paths() -> list[str]:
    """The template interpreter's import directories (its standard library), not the agent's root."""
    return [p for p in sys.path if p != _rootfs.AGENT_ROOT and p.startswith("/") and os.path.isdir(p)]


def _mount_points(root: str, image: dict[str, Any], owner: int) -> None:
    from . import harden

    for path in ("/proc", "/dev", "/sys", "/tmp", harden.HOME, _rootfs.AGENT_ROOT + "/" + _rootfs.AGENT_PACKAGE):
        _dirs(root + path, owner)
    for path in image.get("mkdirs") or ():
        _dirs(root + path, owner)


def _dirs(path: str, owner: int) -> None:
    """``os.makedirs`` giving each directory it makes to ``owner`` (the sandbox's uid): the image's root
    is the sandbox's, and so is what the backend adds to it. An existing non-directory raises."""
    missing: list[str] = []
    head = path
    while not os.path.isdir(head):
        missing.append(head)
        head = os.path.dirname(head)
    for made in reversed(missing):
        os.mkdir(made, 0o755)
        os.chown(made, owner, owner)


def _file(path: str, owner: int) -> None:
    if not os.path.exists(path):
        _dirs(os.path.dirname(path), owner)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o755))


def _bind(src: str, dst: str) -> None:
    """A bind of a read-only mount of the template's root: read-only as its source (the kernel copies
    the flag, and locks it once the sandbox's user namespace copies the mount)."""
    _rootfs.mount(src, dst, None, _rootfs.MS_BIND)


def _bind_recursive(src: str, dst: str) -> None:
    """A recursive bind; each mount keeps its flags (the template made ``/dev`` and ``/sys`` read-only)."""
    _rootfs.mount(src, dst, None, _rootfs.MS_BIND | _rootfs.MS_REC)
