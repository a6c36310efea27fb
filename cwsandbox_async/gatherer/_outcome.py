"""Outcomes: one finished item of work, its error carried as a value.

``OutcomeKind`` says how an item ended:

- ``OK``: it returned ``value``.
- ``ERROR``: the work raised something that is not the platform's failure: a
  non-infrastructure ``SandboxError`` (the program's own failure, e.g.
  ``SandboxExecutionError``, ``SandboxFileError``, or the caller's mistake, e.g.
  ``SandboxValidationError``, ``SandboxTerminatedError``), or any other exception
  (a bug: never relabelled as infrastructure).
- ``INFRA``: the platform failed (a ``SandboxError`` whose ``infrastructure`` is
  True: the sandbox died for outside reasons, the backend or transport broke, a
  create or file transfer timed out). A trainer drops these from advantage
  statistics instead of reading them as a zero reward (``outcome.infra_failure``).
- ``STARVED``: an exec's wall timeout fired while the program was starved of CPU
  by others (``SandboxTimeoutError`` whose ``result.starved`` is True): the
  platform's fault too (``infra_failure`` is True), kept apart because the cure
  is less concurrency, not a healthier backend.
- ``TIMEOUT``: the item missed its deadline (its work was cancelled), or it raised
  a timeout that is the program's outcome (an exec timeout, a ``TimeoutError``).
- ``CANCELLED``: the work raised ``CancelledError`` of its own accord (it awaited
  something that was cancelled) while nobody cancelled the gatherer.

What to do with each kind: ``docs/outcomes.md``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._errors import SandboxError, SandboxTimeoutError

__all__ = ["Outcome", "OutcomeKind", "classify_error", "make_outcome"]

T = TypeVar("T")


class OutcomeKind(enum.StrEnum):
    """How one item of work ended (see the module docstring)."""

    OK = "ok"
    ERROR = "error"
    INFRA = "infra"
    STARVED = "starved"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """One finished item: its position, its key, how it ended, and its value or error.

    ``index`` is the item's position in the input (the order it was pulled in).
    ``key`` is the key given with the item (a mapping key or the first element of
    a ``(key, work)`` pair), else the index. ``duration`` is the item's own wall
    time in seconds, from its start to its end (time spent waiting for a free slot
    is not counted).
    """

    index: int
    key: Any
    kind: OutcomeKind
    value: T | None
    error: BaseException | None
    duration: float

    @property
    def ok(self) -> bool:
        """True if the item returned a value."""
        return self.kind is OutcomeKind.OK

    @property
    def infra_failure(self) -> bool:
        """True if the platform failed (``INFRA``) or starved the program (``STARVED``): drop it from reward stats."""
        return self.kind is OutcomeKind.INFRA or self.kind is OutcomeKind.STARVED

    def unwrap(self) -> T:
        """Return the value, or raise the item's error (chained to nothing new: the original object)."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # OK outcomes hold the returned value, None included


_new = object.__new__
_slots = Outcome.__dict__  # the slots' member descriptors
_set_index = _slots["index"].__set__
_set_key = _slots["key"].__set__
_set_kind = _slots["kind"].__set__
_set_value = _slots["value"].__set__
_set_error = _slots["error"].__set__
_set_duration = _slots["duration"].__set__


def make_outcome(
    index: int, key: Any, kind: OutcomeKind, value: Any, error: BaseException | None, duration: float
) -> Outcome[Any]:
    """``Outcome(index, key, kind, value, error, duration)`` at about half the cost.

    The frozen dataclass's ``__init__`` goes through ``object.__setattr__`` once per
    field; this fills the slots directly (the gatherer makes one per item). The
    result is an ordinary ``Outcome``, equal to the one the constructor would build.
    """
    o = _new(Outcome)
    _set_index(o, index)
    _set_key(o, key)
    _set_kind(o, kind)
    _set_value(o, value)
    _set_error(o, error)
    _set_duration(o, duration)
    return o


def classify_error(exc: BaseException) -> OutcomeKind:
    """Map an exception raised by an item's work to an ``OutcomeKind``.

    An exec timeout whose result is ``starved`` is ``STARVED``; any other
    ``SandboxError`` marked ``infrastructure`` is ``INFRA``; a timeout that is not
    an infrastructure failure is ``TIMEOUT``; anything else is ``ERROR``. An
    exception group is ``INFRA`` if any leaf is an infrastructure failure (the
    platform's failure taints the sample), else ``STARVED`` if any leaf is,
    ``TIMEOUT`` if every leaf is a timeout, else ``ERROR``.
    """
    if isinstance(exc, BaseExceptionGroup):
        kinds = [classify_error(e) for e in exc.exceptions]
        for kind in (OutcomeKind.INFRA, OutcomeKind.STARVED):
            if kind in kinds:
                return kind
        if kinds and all(k is OutcomeKind.TIMEOUT for k in kinds):
            return OutcomeKind.TIMEOUT
        return OutcomeKind.ERROR
    if isinstance(exc, SandboxTimeoutError) and exc.result is not None and exc.result.starved:
        return OutcomeKind.STARVED
    if isinstance(exc, SandboxError) and exc.infrastructure:
        return OutcomeKind.INFRA
    if isinstance(exc, TimeoutError):
        return OutcomeKind.TIMEOUT
    return OutcomeKind.ERROR
