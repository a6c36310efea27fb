"""``cwsandbox-async doctor`` for CoreWeave: credentials present? endpoint answers? Nothing is created."""

from __future__ import annotations

import pytest

from cwsandbox_async.backends.coreweave._doctor import probe
from cwsandbox_async.backends.probes import FAIL, OK, SKIP, WARN, DoctorRequest, Section
from cwsandbox_async.cli.doctor import run_doctor
from cwsandbox_async.testing.coreweave import CoreWeaveTestServer


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CWSANDBOX_API_KEY", "CWSANDBOX_BASE_URL", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)


async def _run(options: dict[str, object], explicit: bool) -> dict[str, str]:
    section = Section("coreweave")
    await probe(section, DoctorRequest(options=options, explicit=explicit, timeout_seconds=10))
    return {c.name: c.status for c in section.checks}


async def test_reports_credentials_and_reachability(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    async with CoreWeaveTestServer(api_key="doctor-key") as server:
        monkeypatch.setenv("CWSANDBOX_API_KEY", "doctor-key")
        assert await _run({"base_url": server.url}, explicit=True) == {"credentials": OK, "reachable": OK}
        monkeypatch.setenv("CWSANDBOX_API_KEY", "wrong")
        assert await _run({"base_url": server.url}, explicit=True) == {"credentials": OK, "reachable": FAIL}
        assert await _run({"base_url": server.url}, explicit=False) == {"credentials": OK, "reachable": WARN}
        assert {r.method for r in server.service.requests} == {"ListSandboxes"}  # read-only: nothing created
        assert server.service.boxes == {}


async def test_not_configured_is_skipped_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    assert await _run({}, explicit=False) == {"credentials": SKIP}
    assert await _run({}, explicit=True) == {"credentials": FAIL}  # TLS endpoint, no key: nothing is called


async def test_the_doctor_command_collects_the_section(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    async with CoreWeaveTestServer() as server:
        report = await run_doctor("coreweave", {"base_url": server.url})
    (section,) = report.sections
    assert section.name == "coreweave"
    assert [c.status for c in section.checks] == [WARN, OK]  # no key for an insecure test endpoint; it answered
