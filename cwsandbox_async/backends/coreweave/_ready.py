"""Waiting for sandboxes to be RUNNING with one ``ListSandboxes`` per round for all of them.

The service has no watch; the SDK polls ``GetSandbox`` per sandbox (>= 2 calls per
second each while it starts). Here every ``create`` waiting at the same time shares
one poll: the first waiter leads a round (sleep ``interval``, then list this backend's
sandboxes by its creator tag, every page), the others wait for that round to end and
read their sandbox's state from it; when the leader's own sandbox is ready another
waiter leads the next round. No background task: a cancelled leader just ends its
round early. A failed list (after the channel's retries) fails every waiter of that round.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

__all__ = ["Readiness"]

#: Lists the sandboxes of this backend: service id -> ``Sandbox`` message.
Lister = Callable[[], Awaitable[dict[str, Any]]]


class Readiness:
    """``await readiness.wait(service_id)`` returns the sandbox's message once it is no longer starting."""

    def __init__(self, lister: Lister, interval: float, starting: Callable[[Any], bool]) -> None:
        self._lister = lister
        self._interval = interval
        self._starting = starting
        self._waiting: set[str] = set()
        self._seen: dict[str, Any] = {}
        self._failure: BaseException | None = None
        self._leading = False
        self._round = anyio.Event()
        #: Rounds polled (each one ``ListSandboxes`` walk); for tests and benchmarks.
        self.rounds = 0

    async def wait(self, service_id: str) -> Any:
        """The ``Sandbox`` message once its state is not a starting one. Raises what the list raised."""
        self._waiting.add(service_id)
        try:
            while service_id not in self._seen:
                if self._leading:
                    round_done = self._round
                    await round_done.wait()
                    if self._failure is not None and service_id not in self._seen:
                        raise self._failure
                    continue
                await self._lead()
            return self._seen.pop(service_id)
        finally:
            self._waiting.discard(service_id)
            self._seen.pop(service_id, None)

    async def _lead(self) -> None:
        self._leading = True
        round_done, self._failure = self._round, None
        try:
            await anyio.sleep(self._interval)
            self.rounds += 1
            try:
                found = await self._lister()
            except Exception as exc:  # handed to every waiter of this round, raised by each
                self._failure = exc
                raise
            for sid in self._waiting:
                sandbox = found.get(sid)
                if sandbox is not None and not self._starting(sandbox):
                    self._seen[sid] = sandbox
        finally:
            self._leading = False
            self._round = anyio.Event()
            round_done.set()
