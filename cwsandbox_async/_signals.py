"""SIGTERM, scoped: while a session's block runs, SIGTERM cancels its body, through an anyio scope.

A batch scheduler stops a training job with SIGTERM. Without a handler the
process dies at once and its sandboxes are left for a sweep; with this one, every
session that asked for it (``Session(handle_signals=True)``, the default) has the
cancel scope around its ``async with`` body cancelled, so the body unwinds, the
session closes within its budget, and the process then dies of SIGTERM as the
default action would have. A second SIGTERM while a close runs only logs: the
close is already bounded (``Timeouts.close_seconds``), and cutting it short
would leave the sandboxes behind.

``sigterm_cancels`` is scoped the way trio's ``open_signal_receiver`` is: it
installs its handler on entry and puts the previous one back on exit, and keeps no
state outside the scope. Scopes nest: each handler also calls the one it replaced
when that is another session's, so one SIGTERM reaches every open session. A scope
left while a later one is still installed stays in that one's chain, passive,
until the later one leaves too and skips it. The handler is installed only in the
main thread with a running asyncio loop (it hands the callback to the loop with
``call_soon_threadsafe``), and only over the default disposition or another
session's handler, so an application's own handler is never replaced. The last
session out (the one that restores the default) is the one whose process dies of
a SIGTERM received meanwhile (``die_if_received``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from ._log import log

__all__ = ["SigtermReceiver", "sigterm_cancels"]


class SigtermReceiver:
    """One scope's SIGTERM handler: calls its callback on the loop, then the handler it replaced."""

    def __init__(self, callback: Callable[[], None], loop: asyncio.AbstractEventLoop | None, previous: Any) -> None:
        self._callback = callback
        self._loop = loop
        self.previous = previous
        self.active = loop is not None
        self.received = False
        self._restored_default = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.active and self._loop is not None and not self._loop.is_closed():
            again = self.received
            self.received = True
            if again:
                log.warning("SIGTERM received again; the close in progress is bounded and continues")
            else:
                log.warning("SIGTERM received; stopping sandboxes")
            self._loop.call_soon_threadsafe(self._callback)
        if isinstance(self.previous, SigtermReceiver):
            self.previous(signum, frame)

    def _restore(self) -> None:
        if not self.active:
            return
        self.active = False
        installed = signal.getsignal(signal.SIGTERM) is self
        if not installed:
            return  # a later scope is installed over this one: it skips this one when it leaves
        previous = self.previous
        while isinstance(previous, SigtermReceiver) and not previous.active:
            previous = previous.previous
        signal.signal(signal.SIGTERM, previous)
        self._restored_default = previous is signal.SIG_DFL

    def die_if_received(self) -> None:
        """After the scope: die of a SIGTERM it received, as the default action would have (the exit
        status says SIGTERM), if it was the last session out. Does nothing otherwise."""
        if self.received and self._restored_default:
            self.received = False
            os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def sigterm_cancels(callback: Callable[[], None]) -> Iterator[SigtermReceiver]:
    """Call ``callback`` (on the running loop) on SIGTERM while the block runs, if the handler could be
    installed (see the module docstring); the previous handler is back when the block ends."""
    previous = signal.getsignal(signal.SIGTERM)
    loop: asyncio.AbstractEventLoop | None = None
    if threading.current_thread() is not threading.main_thread():
        log.debug("SIGTERM handler not installed", reason="not the main thread")
    elif previous is not signal.SIG_DFL and not isinstance(previous, SigtermReceiver):
        log.debug("SIGTERM handler not installed", reason="the application handles SIGTERM")
    else:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError as exc:  # not on asyncio
            log.debug("SIGTERM handler not installed", reason=repr(exc))
    receiver = SigtermReceiver(callback, loop, previous)
    if receiver.active:
        signal.signal(signal.SIGTERM, receiver)
    try:
        yield receiver
    finally:
        receiver._restore()
