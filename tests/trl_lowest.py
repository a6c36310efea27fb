"""Run the TRL tests against the LOWEST TRL the ``trl`` extra allows (``make test-trl-lowest``).

The main ``.venv`` gets the newest TRL pip resolves; this builds ``.venv-trl-lowest``
next to it with only ``trl==<floor>`` installed (``--no-deps``: torch, transformers
and the rest come from the main venv through a ``.pth`` line, so no other torch is
ever resolved), checks that the floor is what imports, and runs every test whose
name mentions TRL there. The floor is read from pyproject.toml, so raising it in
one place moves this check too. Exits with pytest's status.
"""

from __future__ import annotations

import importlib.util
import re
import site
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-trl-lowest"
TESTS = ["tests/test_examples.py", "tests/test_docs.py", "tests/test_trl_wandb.py"]


def trl_floor() -> str:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trl"]
    (spec,) = [s for s in extra if re.match(r"trl\b", s)]
    m = re.fullmatch(r"trl>=([\w.]+)", spec.replace(" ", ""))
    if m is None:
        raise SystemExit(f"cannot read a 'trl>=X' floor from {spec!r}")
    return m.group(1)


def main() -> int:
    floor = trl_floor()
    needed = ("trl", "torch", "transformers", "datasets", "accelerate")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"install the trl extra in this venv first (missing: {', '.join(missing)})")
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    low_site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    base_site = site.getsitepackages()[0]  # this interpreter's venv: torch, transformers, the project
    (Path(low_site) / "cwsandbox-main-venv.pth").write_text(f"import site; site.addsitedir({base_site!r})\n")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    subprocess.run([*pip, f"trl=={floor}"], check=True)
    got = subprocess.run(
        [str(python), "-c", "import trl; print(trl.__version__)"], check=True, capture_output=True, text=True
    ).stdout.strip()
    from packaging.version import Version  # a dependency of trl and transformers

    if Version(got) != Version(floor):
        raise SystemExit(f"expected trl {floor} in {VENV}, imported {got}")
    print(f"TRL {got} (the floor of the trl extra), other packages from {base_site}", flush=True)
    cmd = [str(python), "-m", "pytest", "-q", "-m", "integration", "-k", "trl", *TESTS]
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
