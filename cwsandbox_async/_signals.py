"""SIGTERM, handled in one place: it cancels the bodies of the open sessions, through anyio scopes.

A batch scheduler stops a training job with SIGTERM. Without a handler the
process dies at once and its sandboxes are left for a sweep; with this one, every
session that asked for it (``Session(handle_signals=True)``, the default) has the
cancel scope around its ``async with`` body cancelled, so the body unwinds, the
session closes within its budget, and the process then dies of SIGTERM as the
default action would have. A second SIGTERM while a close runs only logs: the
close is already bounded (``Timeouts.close_seconds``), and cutting it short
would leave the sandboxes behind.

The handler is installed with the running asyncio loop's ``add_signal_handler``
(the library runs on asyncio), only in the main thread, and only if SIGTERM
still has its default disposition when the first session registers, so an
application's own handler is never replaced. It is removed when the last
registered session is done.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ._log import log

__all__ = ["die_of_pending_signal", "on_sigterm"]

#: Callbacks of the sessions registered now (each cancels its own body scope).
_callbacks: dict[object, Callable[[], None]] = {}
#: The loop the handler is installed on, while it is.
_loop: asyncio.AbstractEventLoop | None = None
#: SIGTERM was received (the process re-raises it once the sessions are closed).
_received = False


def _fire() -> None:
    global _received
    again = _received
    _received = True
    if again:
        log.warning("SIGTERM received again; the close in progress is bounded and continues")
    else:
        log.warning("SIGTERM received; stopping sandboxes", sessions=len(_callbacks))
    for callback in list(_callbacks.values()):
        callback()


def _install() -> None:
    global _loop
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the application handles SIGTERM itself
    try:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, _fire)
    except (RuntimeError, NotImplementedError, ValueError) as exc:  # no loop, no signal support here
        log.debug("SIGTERM handler not installed", reason=repr(exc))
        return
    _loop = loop


def _remove() -> None:
    global _loop
    if _loop is not None:
        if not _loop.is_closed():
            _loop.remove_signal_handler(signal.SIGTERM)
        _loop = None


@contextmanager
def on_sigterm(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` on SIGTERM while the block runs (if the handler could be installed)."""
    key = object()
    if not _callbacks and _loop is None:
        _install()
    _callbacks[key] = callback
    try:
        yield
    finally:
        _callbacks.pop(key, None)
        if not _callbacks:
            _remove()


def die_of_pending_signal() -> None:
    """Once the last registered session is closed, die of a SIGTERM received meanwhile, as its default
    action would have (the exit status says SIGTERM). Does nothing if none was received."""
    global _received
    if _received and not _callbacks:
        _received = False
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
