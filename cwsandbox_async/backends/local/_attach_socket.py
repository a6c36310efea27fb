"""The attach socket of a template-born sandbox: bound beside its registry entry, connected to (``_attach``)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable

from ._registry import Registry

__all__ = ["bind_listener", "connect"]


def _at(registry: Registry, sandbox_id: str, act: Callable[[str], None]) -> None:
    """``act(path)`` on the sandbox's socket path, through ``/proc/self/fd`` of the registry directory:
    a unix socket path has 107 bytes at most, and a state directory may be longer."""
    dirfd = os.open(registry.dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        act(f"/proc/self/fd/{dirfd}/{sandbox_id}.sock")
    finally:
        os.close(dirfd)


def bind_listener(registry: Registry, sandbox_id: str) -> socket.socket:
    """Blocking: a listening socket at ``<registry>/<sandbox id>.sock`` (a stale one replaced). ``OSError``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(registry.socket_path(sandbox_id))
        _at(registry, sandbox_id, sock.bind)
        sock.listen(16)
    except BaseException:
        sock.close()
        raise
    return sock


def connect(registry: Registry, sandbox_id: str) -> socket.socket:
    """Blocking: a new channel to the sandbox's PID 1. ``OSError`` (no socket, nobody listening)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        _at(registry, sandbox_id, sock.connect)
    except BaseException:
        sock.close()
        raise
    return sock
