"""Work that outlives the call that caused it: killing an abandoned exec's session, reaping a late pod.

An exec that is cancelled must return at once (the caller's deadline owns the call, and a
backend opens no shielded scope of its own), yet its command keeps running in the pod
until someone kills it. So the call hands the job to ``Cleanup``, which runs it in its
own task in the backend's task group, each job in its own cancel scope with its own deadline (``kill_timeout``). The
next call on the same sandbox first waits for that sandbox's jobs (``settle``), so a
killed command never overlaps the next one. ``aclose`` cancels what is left (the pods
are deleted anyway). A job that fails logs a warning; a job that raises something
unexpected logs it at ERROR (a bug, never hidden).
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from ..._errors import SandboxError
from ..._log import log

__all__ = ["Cleanup"]


@dataclass(eq=False)
class _Job:
    what: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)


class Cleanup:
    """Background jobs keyed by sandbox id, run in ``tg`` (the backend's task group)."""

    def __init__(self, tg: TaskGroup) -> None:
        self._tg = tg
        self._jobs: dict[str, set[_Job]] = {}
        self.failures = 0

    def spawn(self, key: str, what: str, job: Callable[[], Awaitable[None]], *, within: float) -> None:
        """Run ``job()`` in the background, given up after ``within`` seconds."""
        entry = _Job(what)
        self._jobs.setdefault(key, set()).add(entry)

        async def run() -> None:
            try:
                with entry.scope, anyio.move_on_after(within) as timer:
                    await job()
                if timer.cancelled_caught:
                    self.failures += 1
                    log.warning("k8s cleanup gave up", what=what, sandbox_id=key, within=within)
            except SandboxError as exc:
                self.failures += 1
                log.warning("k8s cleanup failed", what=what, sandbox_id=key, error=repr(exc))
            except Exception:
                self.failures += 1
                log.error("k8s cleanup crashed (a bug)", what=what, sandbox_id=key, error=traceback.format_exc())
            finally:
                entry.done.set()
                jobs = self._jobs.get(key)
                if jobs is not None:
                    jobs.discard(entry)
                    if not jobs:
                        del self._jobs[key]

        self._tg.start_soon(run, name=f"cwsandbox-k8s-cleanup-{what}")

    def pending(self, key: str) -> int:
        return len(self._jobs.get(key, ()))

    async def settle(self, key: str) -> None:
        """Wait until the jobs of ``key`` (as of now) have ended."""
        for entry in list(self._jobs.get(key, ())):
            await entry.done.wait()

    def forget(self, key: str) -> None:
        """Cancel the jobs of ``key`` (its pod is being deleted)."""
        for entry in list(self._jobs.get(key, ())):
            entry.scope.cancel()

    async def aclose(self) -> None:
        """Cancel every job and wait for them to end."""
        for jobs in list(self._jobs.values()):
            for entry in list(jobs):
                entry.scope.cancel()
        for entry in [e for jobs in list(self._jobs.values()) for e in jobs]:
            await entry.done.wait()
