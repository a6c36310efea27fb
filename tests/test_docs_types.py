"""Every Python block of README.md and docs/ passes ``mypy --strict``, as a user's program would.

The blocks (``markdown_blocks``, the ones ``test_docs`` runs) are written as modules
into a temporary directory and checked by one ``python -m mypy --strict`` run per
group of blocks that need the same optional extras (a group whose extras are not
installed skips, naming them; the TRL and ART groups are ``integration`` tests, as
their blocks are in ``test_docs``: importing torch's stubs alone takes minutes).

The configuration is the project's ``[tool.mypy]`` (strict, Python 3.11, unused
ignores reported, the same third-party modules without types), without its
``packages`` (the blocks are the files to check), plus what a user of the extras
needs too: ``datasets`` ships no types, and ``trl`` re-exports its trainers through a
lazy module that strict mypy does not see as an explicit export. A block that fails
fails the test with mypy's report (file names say which block: ``<doc>_<line>_...``).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from markdown_blocks import ROOT, Block, blocks, doc_files

ALL_BLOCKS = [b for path in doc_files() for b in blocks(path)]
HEAVY = {"trl", "art"}  # as in test_docs: extras whose blocks are integration tests
#: Per-module settings beyond the project's (see the module docstring).
EXTRA_OVERRIDES = {"datasets.*": {"ignore_missing_imports": True}, "trl": {"implicit_reexport": True}}


def _groups() -> dict[tuple[str, ...], list[Block]]:
    out: dict[tuple[str, ...], list[Block]] = {}
    for block in ALL_BLOCKS:
        out.setdefault(tuple(sorted(block.needs)), []).append(block)
    return out


def _param(needs: tuple[str, ...]) -> object:
    marks = [pytest.mark.integration] if HEAVY & set(needs) else []
    return pytest.param(needs, id="+".join(needs) or "no-extras", marks=marks)


def _ini_value(value: object) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def mypy_ini() -> str:
    """The project's ``[tool.mypy]`` as a mypy.ini, without ``packages``, with ``EXTRA_OVERRIDES``."""
    config = dict(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"])
    overrides = config.pop("overrides", [])
    config.pop("packages", None)
    lines = ["[mypy]", *(f"{k} = {_ini_value(v)}" for k, v in config.items())]
    for override in overrides:
        modules = override["module"]
        settings = {k: v for k, v in override.items() if k != "module"}
        lines += ["", f"[mypy-{_ini_value(modules if isinstance(modules, list) else [modules])}]"]
        lines += [f"{k} = {_ini_value(v)}" for k, v in settings.items()]
    for module, settings in EXTRA_OVERRIDES.items():
        lines += ["", f"[mypy-{module}]", *(f"{k} = {_ini_value(v)}" for k, v in settings.items())]
    return "\n".join(lines) + "\n"


def write_blocks(group: list[Block], where: Path) -> list[Path]:
    """Each block as ``<doc path>_<line>_<heading>.py`` in ``where`` (a valid, unique module name)."""
    files = []
    for block in group:
        name = re.sub(r"[^a-z0-9]+", "_", block.id.lower()).strip("_")
        path = where / f"block_{name}.py"
        path.write_text(block.source, encoding="utf-8")
        files.append(path)
    return files


def run_mypy(files: list[Path], tmp: Path) -> subprocess.CompletedProcess[str]:
    """``python -m mypy --strict`` over ``files`` with ``mypy_ini()``, from ``tmp`` (a fresh cache)."""
    ini = tmp / "mypy.ini"
    ini.write_text(mypy_ini(), encoding="utf-8")
    cmd = [sys.executable, "-m", "mypy", "--strict", "--config-file", str(ini), "--cache-dir", str(tmp / "cache")]
    return subprocess.run(
        [*cmd, *(str(f) for f in files)], cwd=tmp, capture_output=True, text=True, check=False, timeout=900
    )


def test_every_block_is_in_a_group() -> None:
    assert sum(len(g) for g in _groups().values()) == len(ALL_BLOCKS) >= 8


def test_the_config_is_strict_and_keeps_the_projects_overrides() -> None:
    ini = mypy_ini()
    assert "strict = True" in ini
    assert "python_version = 3.11" in ini
    assert "[mypy-wandb.*," in ini
    assert "packages" not in ini


@pytest.mark.timeout(900)
@pytest.mark.parametrize("needs", [_param(n) for n in _groups()])
def test_blocks_pass_mypy_strict(needs: tuple[str, ...], tmp_path: Path) -> None:
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (an optional extra)")
    src = tmp_path / "blocks"
    src.mkdir()
    files = write_blocks(_groups()[needs], src)
    proc = run_mypy(files, tmp_path)
    assert proc.returncode == 0, f"mypy --strict on {len(files)} blocks:\n{proc.stdout}\n{proc.stderr}"
    assert re.match(rf"Success: no issues found in {len(files)} source files?\n", proc.stdout), proc.stdout
