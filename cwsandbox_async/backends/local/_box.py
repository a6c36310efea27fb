"""One local sandbox as the backend holds it: its spec, its status, and the runner that runs it."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from ..._types import SandboxSpec, SandboxStatus
from ._cgroup import SandboxCgroup
from ._runners.base import Runner

__all__ = ["Box"]


@dataclass
class Box:
    spec: SandboxSpec
    #: How it runs (``_runners``): every call goes to it, whichever kind of sandbox it is.
    runner: Runner
    status: SandboxStatus = SandboxStatus.CREATING
    stopping: bool = False
    stopped: anyio.Event = field(default_factory=anyio.Event)

    # What the runner holds, for the doctor's probes (and tests) that look at the host's side.
    @property
    def pid(self) -> int | None:
        return self.runner.pid

    @property
    def host_uid(self) -> int | None:
        return self.runner.host_uid

    @property
    def cgroup(self) -> SandboxCgroup | None:
        return self.runner.cgroup
