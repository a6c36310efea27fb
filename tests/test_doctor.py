"""The doctor's collector: each backend package contributes its own probes, found by name.

The probes themselves (local, kubernetes) run for real in ``test_cli.py``; these
tests register throwaway backend packages to check how the collector treats a
backend with probes, one without, one whose probes raise and one that cannot be
imported.
"""

from __future__ import annotations

import sys
import types

import pytest

from cwsandbox_async.backends import BACKENDS
from cwsandbox_async.backends.probes import FAIL, OK, SKIP, DoctorRequest, Section
from cwsandbox_async.cli.doctor import probe_for, render, run_doctor


def _register(monkeypatch: pytest.MonkeyPatch, name: str, probe: object | None) -> None:
    """A backend package ``doctest_<name>`` in BACKENDS, with a ``_doctor.probe`` unless ``probe`` is None."""
    package = f"doctest_{name}"
    monkeypatch.setitem(BACKENDS, name, f"{package}:Backend")
    monkeypatch.setitem(sys.modules, package, types.ModuleType(package))
    if probe is not None:
        module = types.ModuleType(f"{package}._doctor")
        setattr(module, "probe", probe)  # noqa: B010 - a module built at run time
        monkeypatch.setitem(sys.modules, f"{package}._doctor", module)


@pytest.fixture
def only_test_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide the real backends other than local, so the collector sees only the ones a test registers."""
    for name in [n for n in BACKENDS if n not in ("local", "fake")]:
        monkeypatch.delitem(BACKENDS, name)


async def test_each_backend_contributes_its_section(monkeypatch: pytest.MonkeyPatch, only_test_backends: None) -> None:
    seen: dict[str, DoctorRequest] = {}

    async def default(section: Section, request: DoctorRequest) -> None:
        seen["local"] = request
        section.add("claim", OK, "held", "probe it")

    async def chosen(section: Section, request: DoctorRequest) -> None:
        seen["chosen"] = request
        section.add("claim", OK, "held", "probe it")

    async def other(section: Section, request: DoctorRequest) -> None:
        seen["other"] = request
        section.add("config", SKIP, "not configured here", "look for it")

    _register(monkeypatch, "chosen", chosen)
    _register(monkeypatch, "other", other)
    _register(monkeypatch, "silent", None)  # no _doctor module: no section
    _register(monkeypatch, "local", default)  # the default backend, which looks at the others too
    report = await run_doctor("local", {"opt": 1})
    assert [s.name for s in report.sections] == ["local", "chosen", "other"]
    assert seen["local"].explicit and seen["local"].options == {"opt": 1}
    assert not seen["chosen"].explicit
    assert not seen["other"].explicit and seen["other"].options == {}, "options belong to the chosen backend"
    assert report.ok
    assert report.as_dict()["other"]["checks"][0]["status"] == SKIP
    assert "all protections hold" in render(report)
    skipped = await run_doctor("local", {}, skip=("other",))
    assert [s.name for s in skipped.sections] == ["local", "chosen"]
    alone = await run_doctor("other", {})
    assert [s.name for s in alone.sections] == ["other"], "a backend chosen by name is checked alone"
    assert probe_for("silent") is None


async def test_a_probe_that_raises_is_a_failed_check(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(section: Section, request: DoctorRequest) -> None:
        section.add("first", OK, "held")
        raise KeyError("a bug in the probe")

    _register(monkeypatch, "broken", broken)
    report = await run_doctor("broken", {})
    (section,) = report.sections
    assert [(c.name, c.status) for c in section.checks] == [("first", OK), ("probes ran", FAIL)]
    assert "KeyError" in section.checks[1].detail
    assert not report.ok and "1 check(s) failed" in render(report)


async def test_a_backend_that_cannot_be_imported_is_a_failed_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "missing", "doctest_not_installed_anywhere:Backend")
    report = await run_doctor("missing", {})
    (section,) = report.sections
    assert [(c.name, c.status) for c in section.checks] == [("importable", FAIL)]
    assert "doctest_not_installed_anywhere" in section.checks[0].detail
