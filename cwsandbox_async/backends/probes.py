"""What a backend package gives ``cwsandbox-async doctor``: probes that test its claims on this machine.

A backend package ``cwsandbox_async.backends.<name>`` (the module named in
``BACKENDS``) may hold a module ``_doctor`` with one coroutine function::

    async def probe(section: Section, request: DoctorRequest) -> None

It adds one ``Check`` per claim to ``section`` (``section.add(name, status,
detail, probe)``) and may record facts (``section.facts``). Statuses: ``FAIL``
when a protection did not hold (the doctor then exits 1), ``WARN`` for a missing
optional feature, ``SKIP`` when the backend cannot apply here (no
configuration) and was not asked for by name (``request.explicit`` is False),
``OK`` otherwise. A probe bounds its own waits (``request.timeout_seconds`` per
probe) and releases what it started, under ``request.cleanup()`` (a shielded scope
the doctor bounds: a probe opens no shielded budget of its own, as no backend does).
A probe that needs a whole session (sandboxes, execs) opens one with
``request.open_session(defaults)``: the doctor supplies it, so no backend package
imports the layers above it. An exception that escapes ``probe`` is reported by the
doctor as a failed check of that backend, never as a traceback.

The doctor (``cwsandbox_async.cli.doctor``) finds these modules by name, so a
backend adds its probes without touching the CLI.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FAIL", "OK", "SKIP", "WARN", "Check", "DoctorProbe", "DoctorRequest", "Section", "Status"]

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
class DoctorRequest:
    """What the doctor asks of one backend's probes, and what it lends them."""

    #: The backend's constructor options (from ``--backend-option`` and the per-backend flags).
    options: Mapping[str, Any]
    #: True when the user chose this backend (``--backend NAME``): "not configured" is then a failure.
    explicit: bool
    #: How long one probe (one claim) may take before it counts as failed.
    timeout_seconds: float = 60.0
    #: ``open_session(defaults)``: an unopened ``Session`` on this backend with ``options`` (``async with``);
    #: the doctor supplies it (None: this request cannot open one, and a probe that needs one fails).
    open_session: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None
    #: ``with cleanup():`` a scope shielded from cancellation, bounded by the doctor, to release in
    #: (the default shields nothing).
    cleanup: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext


#: The signature of ``<backend package>._doctor.probe``.
DoctorProbe = Callable[[Section, DoctorRequest], Awaitable[None]]
