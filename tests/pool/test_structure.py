"""The pool's shape: small modules, no import cycles, every task group and cancel scope in a ``with``."""

from __future__ import annotations

import ast
from pathlib import Path

import cwsandbox_async

PACKAGE = Path(cwsandbox_async.__file__).parent
POOL = PACKAGE / "pool"
SCOPES = {"create_task_group", "CancelScope", "move_on_after", "fail_after"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def runtime_imports(path: Path) -> set[str]:
    """Modules of the package that ``path`` imports at run time (anywhere, lazily too; not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            node.body = []
    me = module_name(path).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if is_module(candidate) else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.split(".")[0] == "cwsandbox_async"}


def test_pool_modules_are_small() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in POOL.glob("*.py")}
    assert max(sizes.values()) <= 400, sizes


def test_no_import_cycle_goes_through_the_pool() -> None:
    graph = {module_name(p): runtime_imports(p) for p in PACKAGE.rglob("*.py")}
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
        return False

    cycles = [(m, d) for m in graph if m.startswith("cwsandbox_async.pool") for d in graph[m] if reaches(d, m)]
    assert cycles == [], cycles


def test_every_task_group_and_cancel_scope_is_entered_with_with() -> None:
    """Never ``__aenter__`` in one method and ``__aexit__`` in another (a factory may return one)."""
    for path in POOL.glob("*.py"):
        tree = ast.parse(path.read_text())
        allowed: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.With, ast.AsyncWith)):
                allowed.update(id(item.context_expr) for item in node.items)
            elif isinstance(node, ast.Return) and node.value is not None:
                allowed.add(id(node.value))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in SCOPES:
                    assert id(node) in allowed, f"{path.name}:{node.lineno}: {name}() outside a with"


def test_one_cancellation_model() -> None:
    """anyio scopes only: no native task cancellation in the pool."""
    for path in POOL.glob("*.py"):
        source = path.read_text()
        for banned in ("uncancel(", "task.cancel(", "_task.cancel(", ".cancelling("):
            assert banned not in source, f"{path.name} uses {banned}"
