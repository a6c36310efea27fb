"""What a backend package gives ``cwsandbox-async doctor``: probes that test its claims on this machine.

A backend package ``cwsandbox_async.backends.<name>`` (the module named in
``BACKENDS``) may hold a module ``_doctor`` with one coroutine function::

    async def probe(section: Section, request: ProbeRequest) -> None

It adds one ``Check`` per claim to ``section`` (``section.add(name, status,
detail, probe)``) and may record facts (``section.facts``). Statuses: ``FAIL``
when a protection did not hold (the doctor then exits 1), ``WARN`` for a missing
optional feature, ``SKIP`` when the backend cannot apply here (no
configuration) and was not asked for by name (``request.explicit`` is False),
``OK`` otherwise. A probe bounds its own waits (``request.timeout_seconds`` per
probe) and releases what it started. An exception that escapes ``probe`` is
reported by the doctor as a failed check of that backend, never as a traceback.

The doctor (``cwsandbox_async.cli.doctor``) finds these modules by name, so a
backend adds its probes without touching the CLI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FAIL", "OK", "SKIP", "WARN", "Check", "Probe", "ProbeRequest", "Section", "Status"]

Status = Literal["ok", "warn", "fail", "skip"]
OK: Status = "ok"
WARN: Status = "warn"
FAIL: Status = "fail"
SKIP: Status = "skip"


@dataclass
class Check:
    """One claim: its status, what was found, and the probe that found it."""

    name: str
    status: Status
    detail: str
    probe: str = ""


@dataclass
class Section:
    """One backend's checks and the facts its probes recorded."""

    name: str
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, status: Status, detail: str, probe: str = "") -> Check:
        check = Check(name, status, detail, probe)
        self.checks.append(check)
        return check


@dataclass(frozen=True)
class ProbeRequest:
    """What the doctor asks of one backend's probes."""

    #: The backend's constructor options (from ``--backend-option`` and the per-backend flags).
    options: Mapping[str, Any]
    #: True when the user chose this backend (``--backend NAME``): "not configured" is then a failure.
    explicit: bool
    #: How long one probe (one claim) may take before it counts as failed.
    timeout_seconds: float = 60.0


#: The signature of ``<backend package>._doctor.probe``.
Probe = Callable[[Section, ProbeRequest], Awaitable[None]]
