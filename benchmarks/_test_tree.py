"""The benchmarks' one way into the test tree's helpers (the Kubernetes test server, the cluster tier).

The project's ``tests/`` has no ``__init__.py``: it is not a package, and ``tests.k8s`` must never
be imported by that name. Any dependency may install a top-level package called ``tests`` (``cint``,
through ``polyfile-weave``, does), and a regular package anywhere on ``sys.path`` wins over a
namespace directory, so ``from tests.k8s.real import tenant`` then fails with ``No module named
'tests.k8s'``. Instead ``tests/`` itself goes first on ``sys.path`` and its packages (``k8s``,
``cluster``, both regular packages) and modules (``guards``) are imported by their own names, as
the test suite's own ``rootdir`` does.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["TESTS", "use_test_tree"]

#: The project's test tree.
TESTS = Path(__file__).resolve().parent.parent / "tests"


def use_test_tree() -> None:
    """Put ``tests/`` first on ``sys.path`` (once), so ``import k8s.server`` finds the project's."""
    if str(TESTS) in sys.path:
        sys.path.remove(str(TESTS))
    sys.path.insert(0, str(TESTS))
