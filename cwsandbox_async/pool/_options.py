"""A pool's settings, validated once: sizes, pacing, deadlines and budgets, each documented with its default."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import SandboxValidationError
from .._validate import validate_timeout

if TYPE_CHECKING:
    from .._sandbox import Sandbox

__all__ = ["PoolOptions", "ResetHook", "count_arg", "seconds_arg"]

#: ``async def reset(sandbox) -> None``; raising (or timing out) discards the sandbox.
ResetHook = Callable[["Sandbox"], Awaitable[None]]


def count_arg(value: object, what: str, minimum: int) -> int:
    """An int >= ``minimum`` (bools refused), else ``SandboxValidationError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SandboxValidationError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def seconds_arg(value: object, what: str) -> float:
    """A positive, finite number of seconds, else ``SandboxValidationError``."""
    out = validate_timeout(value, what)
    assert out is not None  # validate_timeout refuses None unless allowed
    return out


def _optional_seconds(value: object, what: str) -> float | None:
    return validate_timeout(value, what, allow_none=True)


def _rate(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SandboxValidationError(f"create_rate must be a positive number per second, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolOptions:
    """Everything a ``SandboxPool`` is configured with (its keyword arguments, validated).

    Sizes: ``size`` idle sandboxes kept warm (default 8); ``max_size`` the hard cap on
    sandboxes alive, being created or being stopped (default ``2 * size``, at least 1).

    Reuse: ``reuse`` (default False: a fresh sandbox per lease); ``reset`` an async hook
    run before a sandbox is returned (needs ``reuse``), bounded by
    ``reset_timeout_seconds`` (30 s).

    Creation: ``create_concurrency`` caps creations in flight (None, the default: an
    adaptive cap that grows while create latency stays within
    ``create_latency_tolerance`` (3.0) times its baseline (the typical latency at low concurrency) and shrinks when
    it rises above or a create fails); ``create_rate``/``create_burst`` an optional rate
    limit on create attempts (off by default); ``create_attempts`` (3) tries per sandbox for
    the platform's failures (``infrastructure=True``), with exponential back-off from
    ``create_backoff_seconds`` (0.5 s) up to ``create_backoff_max_seconds`` (10 s); after
    ``max_consecutive_failures`` (5) of them in a row, leases fail fast with
    ``SandboxCreationError``. A caller's mistake (``infrastructure=False``) is not retried:
    leases fail at once with that error itself.

    Leases: ``lease_timeout_seconds`` (30 s) to wait for a sandbox; ``hold_timeout_seconds``
    (None: unbounded) for the block; ``lifetime_margin_seconds`` (60 s) how long past the
    hold timeout the backend keeps a leased sandbox alive if this process dies (the pool
    calls ``Backend.set_lifetime`` with hold + margin at lease); ``check_on_lease`` (True)
    asks the backend for the status before handing a sandbox out;
    ``health_check_interval_seconds`` (30 s; None: off) sweeps idle sandboxes.

    Closing: ``close_grace_seconds`` (10 s) for held leases to finish before they are
    cancelled, and ``close_timeout_seconds`` (None: the session's ``timeouts.close_seconds``)
    the whole close's budget; inside ``Session`` close, or under a deadline of the caller's,
    what is left of that bounds it instead if it is shorter. The grace is part of the
    budget, never added to it.
    """

    size: int = 8
    max_size: int | None = None
    reuse: bool = False
    reset: ResetHook | None = None
    reset_timeout_seconds: float = 30.0
    create_concurrency: int | None = None
    create_latency_tolerance: float = 3.0
    create_rate: float | None = None
    create_burst: int | None = None
    create_attempts: int = 3
    create_backoff_seconds: float = 0.5
    create_backoff_max_seconds: float = 10.0
    max_consecutive_failures: int = 5
    lease_timeout_seconds: float = 30.0
    hold_timeout_seconds: float | None = None
    lifetime_margin_seconds: float = 60.0
    check_on_lease: bool = True
    health_check_interval_seconds: float | None = 30.0
    close_grace_seconds: float = 10.0
    close_timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        """Raise ``SandboxValidationError`` for the first bad setting."""
        size = count_arg(self.size, "size", 0)
        max_size = count_arg(max(2 * size, 1) if self.max_size is None else self.max_size, "max_size", 1)
        if size > max_size:
            raise SandboxValidationError(f"size ({size}) must not exceed max_size ({max_size})")
        object.__setattr__(self, "max_size", max_size)
        if not isinstance(self.reuse, bool):
            raise SandboxValidationError("reuse must be a bool")
        if self.reset is not None and not self.reuse:
            raise SandboxValidationError("a reset hook needs reuse=True (without reuse every lease is fresh)")
        if self.reset is not None and not callable(self.reset):
            raise SandboxValidationError("reset must be an async callable taking the sandbox")
        if self.create_concurrency is not None:
            count_arg(self.create_concurrency, "create_concurrency", 1)
        tolerance = self.create_latency_tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance > 1:
            raise SandboxValidationError(f"create_latency_tolerance must be a number > 1, got {tolerance!r}")
        if not math.isfinite(tolerance):
            raise SandboxValidationError("create_latency_tolerance must be finite")
        rate = _rate(self.create_rate)
        if rate is None and self.create_burst is not None:
            raise SandboxValidationError("create_burst needs create_rate")
        if self.create_burst is not None:
            count_arg(self.create_burst, "create_burst", 1)
        count_arg(self.create_attempts, "create_attempts", 1)
        count_arg(self.max_consecutive_failures, "max_consecutive_failures", 1)
        for name in (
            "reset_timeout_seconds",
            "create_backoff_seconds",
            "create_backoff_max_seconds",
            "lease_timeout_seconds",
            "lifetime_margin_seconds",
        ):
            object.__setattr__(self, name, seconds_arg(getattr(self, name), name))
        for name in ("hold_timeout_seconds", "health_check_interval_seconds", "close_timeout_seconds"):
            object.__setattr__(self, name, _optional_seconds(getattr(self, name), name))
        grace = self.close_grace_seconds
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not math.isfinite(grace) or grace < 0:
            raise SandboxValidationError(f"close_grace_seconds must be a number >= 0, got {grace!r}")
        object.__setattr__(self, "close_grace_seconds", float(grace))
        object.__setattr__(self, "check_on_lease", bool(self.check_on_lease))

    @property
    def cap(self) -> int:
        """``max_size`` after defaulting (always set once validated)."""
        assert self.max_size is not None
        return self.max_size

    @property
    def create_burst_or_default(self) -> int:
        """The burst of the create rate limit: ``create_burst``, or the rate rounded up."""
        assert self.create_rate is not None
        return self.create_burst if self.create_burst is not None else max(1, math.ceil(self.create_rate))
