"""The problems every attack is scored against, in each shape a scoring path takes them.

A ``Task`` is one problem: assert-style tests for the function paths (split and in-process
harness, ART ``submit_solution``), call-based cases for the judge's ``fn_name`` path, and
stdin/stdout cases for the judge's program paths. Its cases are split into the ones a prompt
shows (visible) and the ones it hides; special-casing the visible ones must fail the hidden.

- ``SUM``: ``solve(xs)`` returns the sum of a list; on stdin, ``n`` then ``n`` integers, print
  their sum. The assert tests use builtins the way HumanEval's do (``abs``, ``isinstance``,
  ``len``, ``set``, ``range``), so a program that shadows one of them is caught if it can be.
- ``MANY``: ``SUM`` with ``MANY_CASES`` cases on stdin: enough that a program sleeping through
  each one outlives any item deadline that ignores the judge's own budgets (30 s of slack).
- ``BIG``: the sum, where the answer is an integer past Python's 4,300-digit string limit.
- ``DEEP``: ``solve(n)`` returns ``[]`` nested ``n`` levels deep, for ``n`` = 5,000.
- ``SET``: ``solve(xs)`` returns the set of the list's elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cwsandbox_async.judge import Problem, TestCase

__all__ = ["BIG", "DEEP", "MANY", "MANY_CASES", "SET", "SUM", "Task"]

#: How many stdin cases ``MANY`` has (14 x the judge's 3 s wall limit per case is past 40 s).
MANY_CASES = 14


@dataclass(frozen=True, slots=True)
class Task:
    """One problem. ``asserts``: the tests of the function paths (visible lines first);
    ``calls``: ``(args, expected)`` of the judge's call-based path; ``stdin``: ``(input, output)``
    of its program paths (empty where the task has no stdin form). ``visible`` of each are shown."""

    name: str
    asserts: str
    calls: tuple[tuple[list[Any], Any], ...]
    stdin: tuple[tuple[str, str], ...] = ()
    fn_name: str = "solve"
    visible: int = 2
    notes: dict[str, str] = field(default_factory=dict)

    def call_problem(self) -> Problem:
        """The judge's call-based form (``fn_name``), every case a ``TestCase(call=True)``."""
        cases = tuple(TestCase(args, want, name=f"call/{i}", call=True) for i, (args, want) in enumerate(self.calls))
        return Problem(cases, fn_name=self.fn_name, name=self.name)

    def stdin_problem(self) -> Problem:
        """The judge's stdin/stdout form."""
        assert self.stdin, f"task {self.name} has no stdin form"
        return Problem(tuple(TestCase(i, o, name=f"io/{n}") for n, (i, o) in enumerate(self.stdin)), name=self.name)


_SUM_ASSERTS = """\
assert solve([1, 2, 3]) == 6
assert solve([]) == 0
assert solve([5, -2]) == 3
assert abs(solve([0.5, 0.25]) - 0.75) < 1e-9
assert isinstance(solve([4, 5]), int)
assert len(set([solve([7]), 7])) == 1
for n in range(1, 7):
    assert solve(list(range(n))) == n * (n - 1) // 2
"""


def _io(xs: list[int]) -> tuple[str, str]:
    return f"{len(xs)}\n{' '.join(map(str, xs))}\n", f"{sum(xs)}\n"


_SUM_STDIN = (
    _io([1, 2, 3]),
    _io([]),
    _io([5, -2]),
    _io([7]),
    _io([10**9] * 4),  # past a 32-bit int
    _io(list(range(30))),
)
_MANY_STDIN = _SUM_STDIN + tuple(_io(list(range(n * 3))) for n in range(1, MANY_CASES - len(_SUM_STDIN) + 1))
assert len(_MANY_STDIN) == MANY_CASES

SUM = Task(
    name="sum",
    asserts=_SUM_ASSERTS,
    calls=(
        ([[1, 2, 3]], 6),
        ([[]], 0),
        ([[5, -2]], 3),
        ([[0.5, 0.25]], 0.75),
        ([[4, 5]], 9),
        ([[7]], 7),
        ([[0, 1, 2, 3, 4]], 10),
        ([[-1, -2, 10]], 7),
    ),
    stdin=_SUM_STDIN,
)
MANY = Task(name="sum-many-cases", asserts=SUM.asserts, calls=SUM.calls, stdin=_MANY_STDIN)

_BIG_N = 10**4400
BIG = Task(
    name="big-int",
    asserts="""\
assert solve([3]) == 3
assert solve([10 ** 4400, 1]) == 10 ** 4400 + 1
assert solve([-(10 ** 4400), 2 * 10 ** 4400]) == 10 ** 4400
""",
    calls=(([[3]], 3), ([[_BIG_N, 1]], _BIG_N + 1), ([[-_BIG_N, 2 * _BIG_N]], _BIG_N)),
    visible=1,
)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


DEEP = Task(
    name="deep",
    asserts="""\
import sys
sys.setrecursionlimit(100000)
assert solve(1) == [[]]
want = []
for _ in range(5000):
    want = [want]
assert solve(5000) == want
""",
    calls=(([1], [[]]), ([5000], _nested(5000))),
    visible=1,
)

SET = Task(
    name="set",
    asserts="""\
assert solve([1, 1, 2]) == {1, 2}
assert solve([]) == set()
assert solve(["a", "b", "a"]) == {"a", "b"}
""",
    calls=(([[1, 1, 2]], {1, 2}), ([[]], set()), ([["a", "b", "a"]], {"a", "b"})),
)
