"""Values across the call harness and the comparators, as properties (hypothesis) and in a real sandbox.

The harness's encoder is its own code (``sandboxed/call_harness.py``, loaded without running
``main``); the driver's reader and comparison are ``_callvalue``. A right answer is never lost
(big ints past Python's 4,300-digit str limit, nesting deeper than any recursion limit, sets,
tuples, NaN, -0.0), and nothing a program prints makes the driver recurse or parse a decimal int.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cwsandbox_async as cwa
from cwsandbox_async.judge import Judge, Limits, TestCase, Verdict, from_apps
from cwsandbox_async.judge._callvalue import decode, values_equal
from cwsandbox_async.judge._callvalue import encode as driver_encode
from cwsandbox_async.judge._compare import compare_call, compare_text

HARNESS = Path(__file__).parents[2] / "cwsandbox_async" / "judge" / "sandboxed" / "call_harness.py"


def _harness() -> dict[str, Any]:
    text = HARNESS.read_text()
    assert text.rstrip().endswith("main()")
    namespace: dict[str, Any] = {"__name__": "call_harness"}
    exec(compile(text.rstrip()[: -len("main()")], str(HARNESS), "exec"), namespace)
    return namespace


_HARNESS = _harness()
EMIT, HARNESS_DECODE = _HARNESS["emit"], _HARNESS["decode"]


def encode(value: Any) -> bytes:
    """The harness's line for ``value`` (written to a file: a pipe would block on a big value)."""
    with tempfile.TemporaryFile() as f:
        EMIT(value, f.fileno())
        f.seek(0)
        return f.read()


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


#: ints past Python's 4,300-digit str limit (drawn as a small offset: hypothesis cannot print them)
BIG_INTS = st.integers(-(10**6), 10**6).map(lambda n: 7**5200 + n)
SCALARS = st.none() | st.booleans() | st.integers() | BIG_INTS | st.floats(allow_nan=True) | st.text()
HASHABLE = st.recursive(
    st.none() | st.booleans() | st.integers() | BIG_INTS | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=10,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        | st.sets(HASHABLE, max_size=4)
    ),
    max_leaves=30,
)


def _has_nan(value: Any) -> bool:
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, float) and math.isnan(v):
            return True
        if isinstance(v, (list, tuple, set, frozenset)):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.values())
    return False


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_any_value_crosses_the_pipe_unchanged(value: Any) -> None:
    got = decode(encode(value))
    assert type(got) is type(value) or isinstance(value, set)  # a set arrives as a frozenset
    if not _has_nan(value):
        assert got == value  # equality exactly as Python's ==, in one process
        assert values_equal(got, value)
        assert compare_call("whitespace", encode(value), value)


@settings(max_examples=200, deadline=None)
@given(VALUES)
def test_arguments_reach_the_harness_unchanged(value: Any) -> None:
    """The driver writes a call's arguments in the harness's own format; the harness reads them back."""
    line = driver_encode(value)
    assert line == encode(value)  # one format, both directions
    if not _has_nan(value):
        assert HARNESS_DECODE(line.decode()) == value


def test_negative_zero_nan_and_infinities_keep_their_identity() -> None:
    got = decode(encode([-0.0, float("nan"), float("inf"), -float("inf")]))
    assert math.copysign(1.0, got[0]) == -1.0 and math.isnan(got[1]) and got[2:] == [math.inf, -math.inf]


@settings(max_examples=200, deadline=None)
@given(VALUES, VALUES)
def test_equality_is_pythons_once_normalised(a: Any, b: Any) -> None:
    """For values without sets or bools, the comparison is Python's == after tuples became lists."""

    def plain(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [plain(m) for m in v]
        if isinstance(v, dict):
            return {k: plain(m) for k, m in v.items()}
        return v

    def simple(v: Any) -> bool:
        todo = [v]
        while todo:
            x = todo.pop()
            if isinstance(x, (bool, set, frozenset)):
                return False
            if isinstance(x, (list, tuple)):
                todo.extend(x)
            elif isinstance(x, dict):
                todo.extend(x.values())
        return True

    if simple(a) and simple(b) and not _has_nan(a) and not _has_nan(b):
        assert values_equal(decode(encode(a)), b) == (plain(a) == plain(b))


@settings(max_examples=200, deadline=None)
@given(st.sets(HASHABLE, max_size=6), st.randoms(use_true_random=False))
def test_a_set_equals_its_members_in_any_order(members: set[Any], rnd: Any) -> None:
    listed = [list(m) if isinstance(m, tuple) else m for m in members]
    rnd.shuffle(listed)
    assert compare_call("whitespace", encode(members), listed)
    assert compare_call("whitespace", encode(set(members)), [*listed, *listed[:1]]) is (not listed)


def test_bools_tuples_dict_keys_and_the_float_tolerance() -> None:
    assert not values_equal(True, 1) and not values_equal(0, False)
    assert values_equal((1, [2, (3,)]), [1, [2, [3]]])
    assert values_equal({1: "a", None: 2}, {"1": "a", "null": 2})
    assert values_equal(1, 1.0) and values_equal(-0.0, 0)
    assert compare_call("float", encode([0.1 + 0.2, 10**400]), [0.3, 10**400])
    assert not compare_call("whitespace", encode(0.1 + 0.2), 0.3)


def test_big_and_deep_values_and_hostile_lines() -> None:
    big = 7**30000  # ~25,000 digits: str() of it raises under Python's default limit
    assert compare_call("whitespace", encode(big), big)
    deep = nested(200_000)
    assert compare_call("whitespace", encode(deep), nested(200_000))
    assert not compare_call("whitespace", encode(deep), nested(199_999))
    deep_set = frozenset([(((((1,),),),),)])
    assert compare_call("whitespace", encode(deep_set), [[[[[[1]]]]]])
    # nothing a program prints makes the driver recurse, raise, or parse a decimal int
    for hostile in (b"[" * 500_000, b"L1 " * 500_000, b"i" + b"9" * 2_000_000, b"d" + b"9" * 100, b"s!!", b"D1 L0 i1"):
        assert not compare_call("whitespace", hostile + b"\n", 1)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=8),
        max_size=6,
    ),
    st.data(),
)
def test_whitespace_ignores_trailing_space_crlf_and_blank_lines(lines: list[str], data: Any) -> None:
    want = "\n".join(line.rstrip() for line in lines).encode()
    pad = data.draw(st.lists(st.sampled_from([" ", "\t", ""]), min_size=len(lines), max_size=len(lines)))
    eol = data.draw(st.sampled_from(["\n", "\r\n"]))
    got = eol.join(line.rstrip() + p for line, p in zip(lines, pad, strict=True)) + eol * data.draw(st.integers(0, 3))
    assert compare_text("whitespace", got.encode(), want)
    assert compare_text("exact", want, want)
    if want.strip():
        assert not compare_text("whitespace", b"x" + got.encode(), want)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=-1e300, max_value=1e300), min_size=1, max_size=5))
def test_float_tolerance_is_relative_or_absolute(values: list[float]) -> None:
    want = " ".join(repr(v) for v in values).encode()
    near = " ".join(repr(v * (1 + 1e-9)) for v in values).encode()
    assert compare_text("float", near, want)
    far = " ".join(repr(v + max(1.0, abs(v)) * 1e-3) for v in values).encode()
    assert not compare_text("float", far, want)


@pytest.fixture(scope="module")
async def sb(local_session: cwa.Session) -> AsyncIterator[cwa.Sandbox]:
    async with local_session.sandbox() as sandbox:
        yield sandbox


async def test_right_answers_a_json_pipe_would_lose_are_accepted(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    """A set against an unordered expected list, an int of 25,000 digits, a list nested 20,000 deep."""
    solution = (
        "import sys\nsys.setrecursionlimit(100000)\n"
        "def f(kind):\n"
        "    if kind == 'set':\n        return {3, 1, 2}\n"
        "    if kind == 'big':\n        return 7 ** 30000\n"
        "    x = 0\n    for _ in range(20000):\n        x = [x]\n    return x\n"
    )
    cases = [TestCase(["set"], [2, 3, 1], call=True), TestCase(["big"], 7**30000, call=True)]
    cases.append(TestCase(["deep"], nested(20000, 0), call=True))
    judge = Judge(local_session, limits=Limits(time_seconds=5.0, memory_mib=256))
    result = await judge.judge(solution, "python", cases, sandbox=sb, fn_name="f")
    assert [c.verdict for c in result.cases] == [Verdict.ACCEPTED] * 3, result
    assert result.score == 1.0


async def test_big_and_deep_arguments_reach_the_candidate(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    solution = (
        "def f(a, b):\n    d = 0\n    while isinstance(b, list) and b:\n        b, d = b[0], d + 1\n    return a + d\n"
    )
    cases = [TestCase([7**30000, nested(20000, 0)], 7**30000 + 20000, call=True), TestCase([1, []], 1, call=True)]
    result = await Judge(local_session).judge(solution, "python", cases, sandbox=sb, fn_name="f")
    assert [c.verdict for c in result.cases] == [Verdict.ACCEPTED] * 2, result


async def test_apps_tuples_and_wrapped_answers(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    row = {"input_output": {"fn_name": "pair", "inputs": [[1], [2]], "outputs": [[[1, 2]], [[2, 3]]]}}
    result = await Judge(local_session).judge(
        "def pair(x):\n    return (x, x + 1)\n", "python", from_apps(row), sandbox=sb
    )
    assert result.score == 1.0, result
