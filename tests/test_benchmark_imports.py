"""Benchmarks reach the test tree's helpers without importing it as ``tests`` (see ``benchmarks/_test_tree``).

A dependency may install a top-level package named ``tests`` (``cint`` via ``polyfile-weave``
does); a regular package wins over the project's namespace directory ``tests/``, so an import of
``tests.k8s`` then fails with ``No module named 'tests.k8s'``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMPORTS_THE_TREE = re.compile(r"^\s*(from\s+tests[.\s]|import\s+tests\b)", re.MULTILINE)


def test_no_benchmark_or_example_imports_the_test_tree_by_that_name() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
        for where in ("benchmarks", "examples")
        for path in sorted((ROOT / where).rglob("*.py"))
        for text in [path.read_text(encoding="utf-8")]
        for m in IMPORTS_THE_TREE.finditer(text)
    ]
    assert not found, found


def test_the_k8s_pool_benchmark_finds_its_helpers_beside_a_foreign_tests_package(tmp_path: Path) -> None:
    foreign = tmp_path / "site" / "tests"
    foreign.mkdir(parents=True)
    (foreign / "__init__.py").write_text("FOREIGN = True\n")  # what a dependency installed
    program = (
        "import tests; assert tests.FOREIGN\n"  # the foreign package is what `tests` means here
        "from benchmarks._k8s_real import tenant_factory\n"
        "tenant = tenant_factory()\n"
        "import sys; print(tenant.__module__, sys.modules[tenant.__module__].__file__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT}:{foreign.parent}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    module, filename = proc.stdout.split()
    assert module == "k8s.real" and filename == str(ROOT / "tests" / "k8s" / "real.py"), proc.stdout
