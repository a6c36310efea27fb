"""What a local sandbox takes from a container image: its layers, user, environment and directory.

``prepare`` pulls the image through ``cwsandbox_async.images`` (a cached image is not asked of the
registry again), holds its layers in the cache for the sandbox's life (``images.hold``, a lease: no prune
or removal takes them), and says how the sandbox runs from it (``ImageRun``); the newborn mounts the
root (``agent/_imageroot``).

- **User**: the image's ``User`` (``uid``, ``uid:gid``, or names from the image's own
  ``/etc/passwd`` and ``/etc/group``); none means uid 0 *of the sandbox's user namespace*, an
  unprivileged host uid with no capability at all (its bounding set is empty and ``NoNewPrivs`` set,
  as for every sandbox process). The layers are single-uid: every file shows as the sandbox's user.
- **Environment**: the sandbox's base (``PATH``, ``HOME``, ``PYTHONNOUSERSITE``), the image's
  ``Env`` over it, the sandbox's ``env`` over that.
- **Working directory**: the sandbox's, unless it is the default (``/workspace``) and the image names
  one. Both exist in the sandbox's root.

Failures: ``ImagePullError`` as ``images.pull`` raises it (whose failure it is on the error);
``SandboxCreationError`` (the caller's, ``infrastructure=False``) for an image ``User`` that names an
account the image does not have.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ..._errors import ImagePullError, SandboxCreationError
from ..._types import DEFAULT_WORKING_DIR, SandboxSpec
from ...images import Image, ImageOptions, hold, pull
from .agent import harden

__all__ = ["DEFAULT_PATH", "ImageRun", "image_user", "prepare"]

#: ``PATH`` of an image sandbox whose image sets none (Docker's default).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class ImageRun:
    """How one sandbox runs from ``image``: ``layers`` (names under the cache's ``layers/``, top
    first), the ids inside, the environment base and the working directory."""

    image: Image
    layers: list[str]
    uid: int
    gid: int
    env: dict[str, str]
    working_dir: str
    mkdirs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Resolved:
    """What a create learns once per image and backend: the image, its lowers, its user's ids."""

    image: Image
    layers: list[str]
    ids: tuple[int, int] | str  # (uid, gid), or why its User names no account


async def prepare(
    spec: SandboxSpec, options: ImageOptions, stack: contextlib.AsyncExitStack, memo: dict[str, Any]
) -> ImageRun:
    """Pull (or find cached) the spec's image and hold it on ``stack`` (see the module docstring).

    ``memo`` (the backend's): an image resolved before is only held again (as ``pull_policy="missing"``
    would find it cached), unless it left the cache since (then it is pulled again); with
    ``pull_policy="always"`` every create asks the registry."""
    d = spec.defaults
    assert d.image is not None
    found: _Resolved | None = memo.get(d.image) if options.pull_policy == "missing" else None
    if found is not None:
        try:
            stack.callback((await hold(found.image, options)).release)
        except ImagePullError:  # removed or pruned since: pull it again
            memo.pop(d.image, None)
            found = None
    if found is None:
        image = await pull(d.image, options)
        stack.callback((await hold(image, options)).release)
        found = memo[d.image] = await anyio.to_thread.run_sync(_resolve, image, Path(options.cache_dir, "layers"))
    return _plan(spec, found)


def _resolve(image: Image, top: Path) -> _Resolved:
    """Worker thread (reads the image's ``/etc/passwd``)."""
    layers = [os.path.relpath(p, top) for p in reversed(image.layers)]
    try:
        ids: tuple[int, int] | str = image_user(image.config.user, image.layers)
    except LookupError as exc:
        ids = str(exc)
    return _Resolved(image, layers, ids)


def _plan(spec: SandboxSpec, found: _Resolved) -> ImageRun:
    """How the sandbox runs from the image: its ids, environment, directories."""
    d = spec.defaults
    if isinstance(found.ids, str):
        raise SandboxCreationError(
            f"sandbox {spec.sandbox_id}: image {d.image}: {found.ids}",
            sandbox_id=spec.sandbox_id,
            reason="image_user",
            infrastructure=False,
        )
    uid, gid = found.ids
    image, layers, config = found.image, found.layers, found.image.config
    working_dir = d.working_dir
    if working_dir == DEFAULT_WORKING_DIR and config.working_dir.startswith("/"):
        working_dir = os.path.normpath(config.working_dir)
    env = {"PATH": DEFAULT_PATH, **harden.SANDBOX_ENV, **config.environment(), **d.env}
    mkdirs = sorted({p for p in (working_dir, d.working_dir) if p != "/" and not p.startswith("/tmp/")})
    return ImageRun(image, layers, uid, gid, env, working_dir, mkdirs)


def image_user(user: str, layers: tuple[Path, ...]) -> tuple[int, int]:
    """The (uid, gid) an image's ``User`` names inside the sandbox; ``LookupError`` for an unknown name."""
    name, _, group = user.partition(":")
    if not name:
        return 0, 0
    if name.isdigit():
        uid, default_gid = int(name), int(name)
    else:
        entry = _lookup(layers, "etc/passwd", name)
        if entry is None:
            raise LookupError(f"its User {user!r} is not in its /etc/passwd")
        uid, default_gid = int(entry[2]), int(entry[3])
    if not group:
        return uid, default_gid
    if group.isdigit():
        return uid, int(group)
    found = _lookup(layers, "etc/group", group)
    if found is None:
        raise LookupError(f"its User {user!r} names a group not in its /etc/group")
    return uid, int(found[2])


def _lookup(layers: tuple[Path, ...], path: str, name: str) -> list[str] | None:
    """The ``name:...`` line of ``path`` in the topmost layer that has that file, split on ``:``."""
    for layer in reversed(layers):
        file = layer / path
        if (layer / "etc").is_symlink() or file.is_symlink() or not file.is_file():  # never a host file
            continue
        try:
            text = file.read_text("utf-8", "replace")
        except OSError:
            return None
        numeric = 4 if path == "etc/passwd" else 3  # uid and gid, or the group's gid
        for line in text.splitlines():
            fields = line.split(":")
            if len(fields) >= numeric and fields[0] == name and all(f.isdigit() for f in fields[2:numeric]):
                return fields
        return None
    return None
