"""The package's shape: no import cycle anywhere, imports only downward (backends never reach the layers
above them, the pool never imports the Session), small pool modules, every task group and cancel scope
of the pool in a ``with``."""

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


def runtime_imports(path: Path, *, typing_too: bool = False) -> set[str]:
    """Modules of the package that ``path`` imports at run time (anywhere, lazily too; not under TYPE_CHECKING,
    unless ``typing_too``)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (
            not typing_too
            and isinstance(node, ast.If)
            and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        ):
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


#: The core below the backends: what a backend may import from outside ``backends/`` (specs, errors, checks,
#: the logger, the SDK's names, the verdict rules, the hosted task group a backend runs its background
#: work in, and the image layer, which knows nothing of sandboxes). Everything else of the package (Session,
#: Sandbox, the deadline and budget, pool, gatherer, metrics, integrations, cli, testing, the package face)
#: is above the backends.
BELOW = ("_errors", "_log", "_sdk", "_tasks", "_types", "_validate", "_verdict", "images")
BELOW_BACKENDS = frozenset(f"cwsandbox_async.{m}" for m in BELOW)


def below_backends(module: str) -> bool:
    """A module of the core below the backends (a package there counts with its own modules)."""
    return module in BELOW_BACKENDS or any(module.startswith(f"{m}.") for m in BELOW_BACKENDS)


def import_graph(*, typing_too: bool = False) -> dict[str, set[str]]:
    graph = {module_name(p): runtime_imports(p, typing_too=typing_too) for p in PACKAGE.rglob("*.py")}
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, deps = work[-1]
            for dep in deps:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(graph[dep]))))
                    break
                if dep in on_stack:
                    low[node] = min(low[node], index[dep])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle_anywhere_in_the_package() -> None:
    """Run-time imports (lazy ones too) form no cycle: each module can be read knowing only what is below it."""
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_backends_import_nothing_above_them() -> None:
    """A backend reaches outside ``backends/`` only for the core below it, even for type hints."""
    upward = {
        m: sorted(d for d in deps if not d.startswith("cwsandbox_async.backends") and not below_backends(d))
        for m, deps in import_graph(typing_too=True).items()
        if m.startswith("cwsandbox_async.backends")
    }
    assert {m: deps for m, deps in upward.items() if deps} == {}


def test_the_core_below_the_backends_imports_only_itself() -> None:
    graph = import_graph(typing_too=True)
    upward = {m: sorted(d for d in graph[m] if not below_backends(d)) for m in graph if below_backends(m)}
    assert {m: deps for m, deps in upward.items() if deps} == {}


def test_the_pool_knows_its_owner_only_as_a_sandbox_source() -> None:
    """The pool draws sandboxes through ``SandboxSource``; it never imports the Session."""
    graph = import_graph(typing_too=True)
    users = sorted(
        m for m, deps in graph.items() if m.startswith("cwsandbox_async.pool") and "cwsandbox_async._session" in deps
    )
    assert users == []


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


def test_the_image_layer_knows_nothing_of_sandboxes() -> None:
    """``images/`` imports only itself and the core's errors and logger: no backend, session or sandbox."""
    allowed = ("cwsandbox_async.images", "cwsandbox_async._errors", "cwsandbox_async._log", "cwsandbox_async._validate")
    upward = {
        m: sorted(d for d in deps if not d.startswith(allowed))
        for m, deps in import_graph(typing_too=True).items()
        if m.startswith("cwsandbox_async.images")
    }
    assert {m: deps for m, deps in upward.items() if deps} == {}
