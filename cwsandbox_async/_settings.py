"""``Timeouts``: every client-side timeout and budget of a ``Session``, in one place.

Per-sandbox deadlines (how long a create, an exec or a file transfer may take)
are ``SandboxDefaults`` fields, overridable per sandbox and per call. What is
here bounds the library's own work around them: the grace it gives a backend
past an exec's timeout, how long one stop may take, how long and how wide a
whole close is, and how long a sweep may take. A close is bounded by
``close_seconds`` all the way down (see ``_budget``): every shielded step of the
library's goes through the session's ``CloseBudget``, and no backend opens a
shielded scope with a budget of its own (``backends/base.py``), but for one: the
local backend's plain path waits up to 5 s, shielded, for a killed command to be
reaped (``backends/local/_plain.py``), so a close can overrun by that much.

One rule for every timeout of the library: ``None`` means the default; a
timeout must be a positive number of seconds; ``0``, negatives and NaN raise
``SandboxValidationError``. ``math.inf`` ("no limit") is accepted only where a
limit is optional: nowhere here, since a close that may hang is a leak.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import cast

from ._validate import validate_count, validate_timeout

__all__ = ["Timeouts"]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The client-side timeouts and budgets of a ``Session`` (``Session(timeouts=Timeouts(...))``).

    Raises ``SandboxValidationError`` for a value that breaks the rule in the
    module docstring; a field given as ``None`` takes its default.
    """

    #: How long past an exec's own timeout the client waits before it calls the backend stuck
    #: (``SandboxTimeoutError``, infrastructure). The backend kills the command at its timeout itself.
    exec_grace_seconds: float = 10.0
    #: How long stopping one sandbox may take (the backend's destroy) before it is abandoned and logged.
    stop_seconds: float = 15.0
    #: How long a whole ``Session`` close may take: its pools, every sandbox, the backend. Every
    #: shielded step below runs under it, so the close returns within this bound (plus scheduling;
    #: see the module docstring for the one shield of the local plain path).
    close_seconds: float = 60.0
    #: Sandboxes stopped at once when a session closes.
    close_concurrency: int = 64
    #: How long one ``Session.sweep`` (the backend's bulk delete, or its list and one destroy each) may take.
    sweep_seconds: float = 120.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                checked: float = validate_count(value, f.name, default=cast(int, f.default))
            else:
                checked = validate_timeout(value, f.name, default=cast(float, f.default))
            object.__setattr__(self, f.name, checked)
