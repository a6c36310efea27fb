"""Group-aware gathering for GRPO: per-group outcome lists and an infrastructure-failure mask.

GRPO scores each completion against the others of its group (same prompt). An
infrastructure failure (the sandbox died, or the program was starved of CPU)
says nothing about the completion, so it must be dropped from the group's
statistics rather than scored as zero: ``GroupedOutcomes.infra_mask`` marks
those items (``OutcomeKind.INFRA`` and ``OutcomeKind.STARVED``).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._errors import SandboxValidationError
from ._gather import DEFAULT_LIMIT, OutcomeSink, Work, gather
from ._outcome import Outcome, OutcomeKind

__all__ = ["GroupedOutcomes", "gather_groups"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GroupedOutcomes(Generic[K, T]):
    """Outcomes per group, each list in the group's input order.

    ``outcome.key`` is ``(group, position in group)``. Groups keep the order of
    the input mapping; a group with no items maps to an empty list.
    """

    by_group: dict[K, list[Outcome[T]]]

    @property
    def infra_mask(self) -> dict[K, list[bool]]:
        """Per group, True where the item failed for infrastructure reasons or was starved (drop it from advantages)."""
        return {g: [o.infra_failure for o in outs] for g, outs in self.by_group.items()}

    @property
    def infra_count(self) -> int:
        """How many items failed for infrastructure reasons (starved ones included), over all groups."""
        return sum(o.infra_failure for outs in self.by_group.values() for o in outs)

    @property
    def starved_count(self) -> int:
        """Of ``infra_count``: items whose exec timed out while starved of CPU (lower the concurrency)."""
        return sum(o.kind is OutcomeKind.STARVED for outs in self.by_group.values() for o in outs)

    def __getitem__(self, group: K) -> list[Outcome[T]]:
        return self.by_group[group]

    def __iter__(self) -> Iterator[K]:
        return iter(self.by_group)

    def __len__(self) -> int:
        return len(self.by_group)


class _Pairs(Collection[tuple[tuple[Any, int], Any]]):
    """``((group, j), work)`` pairs, read lazily; sized (so unread coroutines get closed) when every group is."""

    def __init__(self, groups: Mapping[Any, Iterable[Any]]) -> None:
        self._groups = groups
        sized = [v for v in groups.values() if isinstance(v, Collection)]
        self._len: int | None = sum(len(v) for v in sized) if len(sized) == len(groups) else None

    def __iter__(self) -> Iterator[tuple[tuple[Any, int], Any]]:
        for g, items in self._groups.items():
            for j, w in enumerate(items):
                yield (g, j), w

    def __len__(self) -> int:
        if self._len is None:
            raise TypeError("a group is not sized")
        return self._len

    def __contains__(self, x: object) -> bool:
        return any(x == p for p in self)


async def gather_groups(
    groups: Mapping[K, Iterable[Work[T]]],
    *,
    limit: int = DEFAULT_LIMIT,
    timeout_seconds: float | None = None,
    metrics: OutcomeSink | None = None,
    progress: bool | None = None,
) -> GroupedOutcomes[K, T]:
    """Run every group's items through one bounded gatherer; return outcomes grouped, in input order.

    ``limit`` bounds items in flight over all groups together. Items, deadlines,
    errors and cancellation behave as in ``gather``. Raises
    ``SandboxValidationError`` if ``groups`` is not a mapping of iterables.
    """
    if not isinstance(groups, Mapping):
        raise SandboxValidationError(f"groups must be a mapping of group key to items, got {type(groups).__name__}")
    for g, items in groups.items():
        if not isinstance(items, Iterable) or isinstance(items, (str, bytes)):
            raise SandboxValidationError(f"group {g!r} must be an iterable of work, got {type(items).__name__}")
    by_group: dict[K, list[Outcome[T]]] = {g: [] for g in groups}
    pairs = _Pairs(groups)
    work: Iterable[Any] = pairs if pairs._len is not None else iter(pairs)
    outcomes = await gather(work, limit=limit, timeout_seconds=timeout_seconds, metrics=metrics, progress=progress)
    for outcome in outcomes:  # input order: each group's items in order
        by_group[outcome.key[0]].append(outcome)
    return GroupedOutcomes(by_group)
