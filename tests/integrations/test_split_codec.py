"""The split harness's pipe codec: any value a correct answer can be crosses as itself.

The codec lives in the program text the sandbox runs (``_split_program``); these tests exec that
very text (``SPLIT_SOURCE``) and call its ``_cwsandbox_codec``, so what is tested is what is sent.
Each value goes through ``encode``, ``json.dumps``/``json.loads`` (the pipe) and ``decode``, and must
come back as the same value: same types all the way down, floats bit for bit, dicts in their order,
and ``==`` against any other value exactly as the original's in one process. Then a few values
through a real local sandbox (``code_reward``): a 10,000-digit int, lists nested 5,000 deep, a set.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS
from hypothesis import given, settings
from hypothesis import strategies as st

from cwsandbox_async.integrations._split import SPLIT_SOURCE
from cwsandbox_async.integrations.trl import code_reward


def _codec() -> tuple[Any, Any]:
    space: dict[str, Any] = {"__name__": "split_program_under_test"}  # not __main__: the harness does not start
    exec(compile(SPLIT_SOURCE, "_split_program.py", "exec"), space)
    return space["_cwsandbox_codec"]()


ENCODE, DECODE = _codec()


def no_handles(value: object) -> list[Any]:
    raise TypeError(f"not data: {type(value).__name__}")


def cross(value: object) -> Any:
    """``value`` through the codec and the pipe's JSON, as the other process gets it."""
    wire = json.dumps(ENCODE(value, no_handles), separators=(",", ":"))
    return DECODE(json.loads(wire), lambda tag, ident: pytest.fail(f"a handle {tag}{ident} in plain data"))


def shape(value: object) -> list[object]:
    """A flat, exact description of ``value`` (types, float bits, order; a set's members sorted), no recursion."""
    out: list[object] = []
    todo: list[object] = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, _Close):
            out.append(")")
            continue
        t = type(v)
        if t is float:
            out.append(("float", struct.pack(">d", v).hex()))
        elif t is complex:
            out.append(("complex", struct.pack(">dd", v.real, v.imag).hex()))
        elif t in (list, tuple):
            out.append((t.__name__, len(v)))  # type: ignore[arg-type]
            todo.append(_Close())
            todo.extend(reversed(v))  # type: ignore[call-overload]
        elif t is dict:
            out.append(("dict", len(v)))  # type: ignore[arg-type]
            todo.append(_Close())
            for k, x in reversed(list(v.items())):  # type: ignore[attr-defined]
                todo.extend((x, k))
        elif t in (set, frozenset):
            out.append((t.__name__, sorted(repr(shape(x)) for x in v)))  # type: ignore[attr-defined]
        else:
            out.append((t.__name__, v))
    return out


class _Close:
    pass


def hashables() -> st.SearchStrategy[Any]:
    leaves = st.none() | st.booleans() | st.integers() | st.text() | st.binary() | st.floats(allow_nan=False)
    return st.recursive(leaves, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=4), max_leaves=8)


def big_ints() -> st.SearchStrategy[int]:
    return st.builds(
        lambda base, power, sign: sign * base**power,
        st.integers(2, 10**6),
        st.integers(1, 3000),
        st.sampled_from((1, -1)),
    )


def values(nan: bool = True) -> st.SearchStrategy[Any]:
    """JSON-like values and Python's own: None, bools, ints of any size, floats (inf, -0.0, NaN), str,
    bytes, bytearray, complex, and lists, tuples, dicts, sets, frozensets of them."""
    floats = st.floats(allow_nan=nan)
    leaves = (
        st.none()
        | st.booleans()
        | st.integers()
        | big_ints()
        | floats
        | st.text()
        | st.binary()
        | st.binary().map(bytearray)
        | st.complex_numbers(allow_nan=nan)
    )
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.tuples(inner, inner)
            | st.dictionaries(hashables(), inner, max_size=4)
            | st.sets(hashables(), max_size=4)
            | st.frozensets(hashables(), max_size=4)
        ),
        max_leaves=20,
    )


@settings(max_examples=300, deadline=None)
@given(values())
def test_any_value_crosses_as_itself(value: object) -> None:
    assert shape(cross(value)) == shape(value)


@settings(max_examples=300, deadline=None)
@given(values(nan=False), values(nan=False))
def test_equality_after_crossing_is_pythons_own(a: object, b: object) -> None:
    """``==`` on the crossed value is what it is on the original in one process (NaN apart, below)."""
    assert (cross(a) == b) == (a == b)
    assert (cross(a) == a) is True
    assert (cross(a) != cross(b)) == (a != b)


def test_nan_negative_zero_infinities_and_bool_versus_int() -> None:
    got = cross([math.nan, float("nan"), -0.0, math.inf, -math.inf, True, 1, False, 0, 1.0])
    assert got[0] is math.nan  # the module's NaN stays the module's: [math.nan] == [math.nan] as in one process
    assert got == [math.nan, got[1], -0.0, math.inf, -math.inf, True, 1, False, 0, 1.0]
    assert got[1] is not math.nan and math.isnan(got[1]) and got[1] != got[1]
    assert math.copysign(1.0, got[2]) == -1.0
    assert [type(x) for x in got[5:]] == [bool, int, bool, int, float]
    shared = float("nan")
    twice = cross([shared, shared])
    assert twice[0] is twice[1] and twice == twice  # one object twice stays one object
    payload = struct.unpack(">d", bytes.fromhex("fff8000000000123"))[0]
    assert struct.pack(">d", cross(payload)).hex() == "fff8000000000123"  # a NaN's sign and payload


def test_big_ints_cross_past_the_decimal_string_limit_in_hexadecimal() -> None:
    limit = sys.get_int_max_str_digits()
    huge = 7**60000  # about 50,700 digits: str(huge) raises here, as json.dumps(huge) would
    with pytest.raises(ValueError):
        str(huge)
    for n in (huge, -huge, 2**53, -(2**53), 2**53 - 1, 10**limit):
        assert cross(n) == n and type(cross(n)) is int
    wire = json.dumps(ENCODE(huge, no_handles))
    assert wire.startswith('[["i", "') and len(wire) < huge.bit_length() // 3  # hexadecimal, not decimal


def test_nesting_of_any_depth_crosses_without_recursion() -> None:
    depth = 100_000  # a hundred times the interpreter's recursion limit
    for wrap in (lambda x: [x], lambda x: (x,), lambda x: {"k": x}, lambda x: frozenset([x]), lambda x: [1, x, 2]):
        value: Any = 0
        for _ in range(depth):
            value = wrap(value)
        got = cross(value)
        wire = json.dumps(ENCODE(value, no_handles))
        assert json.loads(wire)  # json's own recursion limit never applies: the wire form is flat
        levels = 0
        while got != 0:
            assert type(got) is type(value)
            got = next(iter(got.values())) if type(got) is dict else next(x for x in got if x not in (1, 2))
            levels += 1
        assert levels == depth


def test_shared_and_cyclic_references_are_kept() -> None:
    inner = [1, 2]
    loop: list[Any] = [inner, inner]
    loop.append(loop)
    mapping: dict[str, Any] = {}
    mapping["self"] = mapping
    holder = ([],)
    holder[0].append(holder)  # a tuple in a cycle through a list
    got = cross([loop, mapping, holder])
    assert got[0][0] is got[0][1] and got[0][2] is got[0] and got[0][0] == [1, 2]
    assert got[1]["self"] is got[1]
    assert got[2][0][0] is got[2]


def test_dicts_keep_their_order_and_sets_their_members() -> None:
    d = {"b": 1, "a": 2, 3: (4, 5), (1, "x"): frozenset({1, 2})}
    got = cross(d)
    assert list(got.items()) == list(d.items()) and type(got[3]) is tuple
    assert cross({1, 2, 3}) == {1, 2, 3} and type(cross({1})) is set and type(cross(frozenset())) is frozenset
    assert cross([1, 2]) != (1, 2) and cross((1, 2)) != [1, 2]  # a list is not a tuple, as in one process


def test_subclasses_cross_as_their_base_value_without_running_their_code() -> None:
    class Loud(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

        def __index__(self) -> int:
            raise AssertionError("the codec ran the program's code")

    class Words(str):
        def __str__(self) -> str:
            raise AssertionError("the codec ran the program's code")

    got = cross([Loud(3), Words("w")])
    assert got == [3, "w"] and [type(x) for x in got] == [int, str]
    assert got[0] != 4  # its __eq__ did not come along


@pytest.mark.parametrize(
    "nodes",
    [
        [],
        {"l": 1},
        [["l", [5]]],  # a reference out of range
        [["l", [-1]]],
        [["l", [0, 1]]],
        [["l", 1.5]],  # json floats are never sent
        [1.5],
        [["t", [0]]],  # a tuple that holds itself: impossible in Python
        [["t", [1]], ["z", [0]]],
        [["s", [1]], ["l"]],  # an unhashable member
        [["d", 1]],  # a key without a value
        [["q"]],
        [["i", "zz"]],
        [["f", "00"]],
        [["H", 1]],  # a handle the other side never gave
    ],
)
def test_malformed_input_is_refused(nodes: object) -> None:
    def no_such_handle(tag: str, ident: int) -> object:
        raise ValueError(f"no handle {tag}{ident}")

    with pytest.raises((ValueError, TypeError)):
        DECODE(nodes, no_such_handle)


# -- end to end: the values through a real sandbox, T and C two processes ------------------------------

#: Each: (program, tests). The tests hold the expected value; the program returns it from C.
THROUGH_A_SANDBOX = {
    "a 10,000-digit int": (
        "def f():\n    return 7 ** 11834\n",
        "import sys\nn = f()\nassert n == 7 ** 11834 and n.bit_length() > 33000\n",
    ),
    "a list nested 5,000 deep": (
        "def f():\n    x = 0\n    for _ in range(5000):\n        x = [x]\n    return x\n",
        "x, depth = f(), 0\nwhile x != 0:\n    x, depth = x[0], depth + 1\nassert depth == 5000\n",
    ),
    "an argument nested 5,000 deep": (
        "def depth(x):\n    n = 0\n    while x != 0:\n        x, n = x[0], n + 1\n    return n\n",
        "x = 0\nfor _ in range(5000):\n    x = [x]\nassert depth(x) == 5000\n",
    ),
    "a set": ("def f():\n    return {3, 1, 2}\n", "assert f() == {1, 2, 3} and type(f()) is set\n"),
    "a tuple, -0.0, NaN, bytes, a dict's order": (
        "import math\ndef f():\n    return (-0.0, math.nan, b'\\x00', {'b': 1, 'a': 2})\n",
        "import math\nz, n, b, d = f()\n"
        "assert math.copysign(1, z) == -1 and n is math.nan and b == b'\\x00' and list(d) == ['b', 'a']\n",
    ),
}


async def test_values_cross_a_real_sandbox(local_only: None) -> None:
    reward = code_reward(tests_column="tests", extractor=lambda t: t, pool_size=0, verbose=False, timeout_seconds=30)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            rewards = await reward(
                completions=[p for p, _ in THROUGH_A_SANDBOX.values()], tests=[t for _, t in THROUGH_A_SANDBOX.values()]
            )
    finally:
        await reward.aclose()
    got = {
        name: (r, v.kind, v.reason) for name, r, v in zip(THROUGH_A_SANDBOX, rewards, reward.last_verdicts, strict=True)
    }
    assert all(r == 1.0 for r, _, _ in got.values()), got


def test_a_size_limit_stops_encoding_early() -> None:
    """The candidate's top-level names are sent by value only up to a size (else as a handle)."""
    for big in (bytes(1 << 21), "x" * (1 << 21), list(range(1 << 18)), 1 << (1 << 23)):
        with pytest.raises(OverflowError):
            ENCODE(big, no_handles, 1 << 17)
    assert DECODE(json.loads(json.dumps(ENCODE(list(range(1000)), no_handles, 1 << 17))), None) == list(range(1000))
