"""``cwsandbox-async doctor``: collects the probes each backend package contributes and renders the report.

Each backend's probes live in its own package (``backends/<name>/_doctor.py``,
the contract is in ``cwsandbox_async.backends.probes``), so a new backend adds its
section without touching this module. The chosen backend runs as asked for by
name (``explicit``: "not configured" fails); with the default backend (local) the
other backends run too, and report ``skip`` where they are not configured. A
probe that raises, or a backend package that cannot be imported, becomes a
failed check of its section, not a traceback.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .._budget import CloseBudget
from .._session import Session
from .._types import SandboxDefaults
from ..backends import BACKENDS
from ..backends.probes import FAIL, DoctorProbe, DoctorRequest, Section

__all__ = ["DoctorReport", "probe_for", "render", "run_doctor"]

#: Backends with no machine of their own to check (the in-memory fake).
NOT_PROBED = frozenset({"fake"})
#: The backend whose doctor also looks at the others.
DEFAULT_BACKEND = "local"
#: How long a probe may take to release what it started (a client, a channel), shielded.
CLEANUP_SECONDS = 60.0


@dataclass
class DoctorReport:
    """What ``run_doctor`` found: one section per backend probed, each with its facts and checks.

    ``ok`` is False when any check failed (``FAIL``); ``WARN`` and ``SKIP`` leave it True."""

    sections: list[Section]

    @property
    def ok(self) -> bool:
        return not any(c.status == FAIL for s in self.sections for c in s.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            **{s.name: {"facts": s.facts, "checks": [asdict(c) for c in s.checks]} for s in self.sections},
        }


def probe_for(name: str) -> DoctorProbe | None:
    """The ``probe`` of backend ``name``'s ``_doctor`` module; None if it offers none.

    Raises ``ImportError`` if the backend package itself cannot be imported
    (a missing optional dependency).
    """
    module_name = BACKENDS[name].partition(":")[0] + "._doctor"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise
    probe: DoctorProbe | None = getattr(module, "probe", None)
    return probe


async def _section(name: str, request: DoctorRequest) -> Section | None:
    section = Section(name)
    try:
        probe = probe_for(name)
        if probe is None:
            return None
        await probe(section, request)
    except ImportError as exc:
        section.add("importable", FAIL, f"the {name} backend cannot be imported: {exc}", f"import {BACKENDS[name]}")
    except Exception as exc:  # a probe that broke is a failed section, reported, not a traceback
        section.add("probes ran", FAIL, f"the probes themselves failed: {exc!r}", f"{name} doctor probes")
    return section


async def run_doctor(chosen: str, options: Mapping[str, Any], *, skip: Collection[str] = ()) -> DoctorReport:
    """Run the chosen backend's probes (with ``options``); with the default backend, the others' too.

    ``skip`` names backends not to look at. Never raises for a probe's failure:
    it is in the report.
    """
    sections = []
    names = [chosen]
    if chosen == DEFAULT_BACKEND:
        names += [n for n in BACKENDS if n not in (chosen, *NOT_PROBED, *skip)]
    budget = CloseBudget()  # the probes release what they started under it (a shielded scope, bounded)
    for name in names:
        own = dict(options) if name == chosen else {}
        request = DoctorRequest(
            options=own,
            explicit=name == chosen,
            open_session=functools.partial(_open_session, name, own),
            cleanup=lambda: budget.shielded(CLEANUP_SECONDS),
        )
        section = await _section(name, request)
        if section is not None:
            sections.append(section)
    return DoctorReport(sections)


def _open_session(backend: str, options: Mapping[str, Any], defaults: SandboxDefaults) -> Session:
    return Session(defaults, backend=backend, backend_options=dict(options), handle_signals=False)


def render(report: DoctorReport) -> str:
    """The report as the text ``cwsandbox-async doctor`` prints."""
    lines = []
    for section in report.sections:
        lines.append(f"{section.name} backend")
        for c in section.checks:
            lines.append(f"  {c.status:<5} {c.name:<24} {c.detail}")
            if c.probe:
                lines.append(f"  {'':<5} {'':<24} probe: {c.probe}")
        if section.facts.get("limits_enforced_by"):
            enforced = ", ".join(f"{k}: {v}" for k, v in sorted(section.facts["limits_enforced_by"].items()))
            lines.append(f"  limits enforced by: {enforced}")
    failed = sum(c.status == FAIL for s in report.sections for c in s.checks)
    lines.append("all protections hold" if report.ok else f"{failed} check(s) failed")
    return "\n".join(lines)
