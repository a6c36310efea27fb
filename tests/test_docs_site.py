"""The documentation site builds with warnings as errors, and its API reference covers the public API.

The public API is every name in the ``__all__`` of ``cwsandbox_async`` and of each of its modules
whose dotted path has no part starting with ``_`` (read statically by griffe, as mkdocstrings reads
it: no optional extra is imported). A name is covered when the built site's inventory
(``objects.inv``) holds it under that module, or holds the same object under another public path
(``cwsandbox_async.pool.Lease`` is ``cwsandbox_async.Lease``). A new public name that no reference
page renders fails here, and so does a public class or function without a docstring of its own.

Needs the docs extra (``pip install -e '.[docs]'``: mkdocs, mkdocs-material, mkdocstrings-python);
skipped without it. An e2e-lane test (it runs ``mkdocs build``): ``make test`` runs it where the
extra is installed, as CI does, and ``make docs`` runs the same build.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "griffe")
MISSING = [m for m in DOCS_MODULES if importlib.util.find_spec(m.split(".")[0]) is None]

pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"the docs extra is not installed (no {', '.join(MISSING)}): pip install -e '.[docs]'"
)


def inventory(path: Path) -> set[str]:
    """The names of a Sphinx inventory (version 2: four header lines, then zlib)."""
    data = path.read_bytes()
    header = data.split(b"\n", 4)
    assert header[0] == b"# Sphinx inventory version 2", header[0]
    return {line.split(" ", 1)[0] for line in zlib.decompress(header[4]).decode().splitlines()}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return out


def public_modules() -> Iterator[tuple[str, list[str], object]]:
    """(module path, its ``__all__``, the griffe module) of every public module that has one."""
    import griffe

    root = griffe.load("cwsandbox_async", search_paths=[str(ROOT)], resolve_aliases=False)

    def walk(module: griffe.Module) -> Iterator[griffe.Module]:
        yield module
        for sub in module.modules.values():
            yield from walk(sub)

    for module in walk(root):
        if any(part.startswith("_") for part in module.path.split(".")[1:]) or module.exports is None:
            continue
        yield module.path, [e if isinstance(e, str) else e.name for e in module.exports], module


def canonical(obj: object) -> str:
    """The path where a griffe object (or an alias's target) is defined."""
    import griffe

    if isinstance(obj, griffe.Alias):
        return obj.final_target.path
    assert isinstance(obj, griffe.Object)
    return obj.path


@pytest.mark.timeout(600)
def test_the_site_builds_strictly_and_the_reference_covers_every_public_name(site: Path) -> None:
    import griffe

    documented = inventory(site / "objects.inv")
    root = griffe.load("cwsandbox_async", search_paths=[str(ROOT)], resolve_aliases=False)
    documented_targets = set()
    for name in documented:
        if not name.startswith("cwsandbox_async."):
            continue
        try:
            documented_targets.add(canonical(root[name.removeprefix("cwsandbox_async.")]))
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue  # a heading or an object griffe does not resolve: not a target
    missing = []
    names = 0
    for path, exports, module in public_modules():
        for name in exports:
            names += 1
            if f"{path}.{name}" in documented:
                continue
            obj = module[name]  # type: ignore[index]
            if canonical(obj) not in documented_targets:
                missing.append(f"{path}.{name}")
    assert names > 150, names  # the walk found the public modules
    assert not missing, f"public names no reference page renders (add them to docs/reference/): {missing}"


def test_every_public_class_and_function_has_a_docstring() -> None:
    import griffe

    bare = []
    for path, exports, module in public_modules():
        for name in exports:
            obj = module[name]  # type: ignore[index]
            target = obj.final_target if isinstance(obj, griffe.Alias) else obj
            if target.kind in (griffe.Kind.CLASS, griffe.Kind.FUNCTION) and not (
                target.docstring and target.docstring.value.strip()
            ):
                bare.append(f"{path}.{name}")
    assert not bare, f"public classes and functions without a docstring: {bare}"
