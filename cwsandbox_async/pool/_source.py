"""``SandboxSource``: what a pool needs from its owner, and nothing more (a ``Session`` is one)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._budget import CloseBudget
    from .._sandbox import Sandbox
    from .._settings import Timeouts
    from .._types import SandboxDefaults
    from ..metrics._aggregator import MetricsAggregator

__all__ = ["SandboxSource"]


class SandboxSource(Protocol):
    """The owner a pool draws sandboxes from: creates them, hosts the pool's background work in its task
    group, closes the pool when it closes, and holds the metrics and the close budget."""

    @property
    def defaults(self) -> SandboxDefaults: ...

    @property
    def timeouts(self) -> Timeouts: ...

    @property
    def close_budget(self) -> CloseBudget: ...

    @property
    def metrics(self) -> MetricsAggregator: ...

    @property
    def is_open(self) -> bool:
        """Whether sandboxes may be created now."""
        ...

    async def create_sandbox(self, defaults: SandboxDefaults | None = None) -> Sandbox: ...

    async def start_background(
        self, host: Callable[..., Coroutine[Any, Any, Any]], name: str, *, closer: Callable[[], Awaitable[None]]
    ) -> None:
        """Start ``host`` in the owner's task group (``TaskGroup.start``: it reports readiness) and run
        ``closer`` when the owner closes, before its sandboxes are stopped."""
        ...

    def remove_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Forget a ``closer`` (the pool closed first)."""
        ...
