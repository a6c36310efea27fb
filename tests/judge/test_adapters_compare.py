"""Dataset adapters and comparison modes, without a sandbox."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib

import pytest

from cwsandbox_async import SandboxValidationError
from cwsandbox_async.judge import LANGUAGES, Language, from_apps, from_asserts, from_livecodebench, get_language
from cwsandbox_async.judge._compare import compare_call, compare_text


def test_whitespace_ignores_only_trailing_whitespace() -> None:
    assert compare_text("whitespace", b"1 2  \r\n3\n\n\n", b"1 2\n3")
    assert not compare_text("whitespace", b"1  2\n", b"1 2\n")  # inner spacing matters
    assert not compare_text("whitespace", b" 1\n", b"1\n")  # leading too
    assert not compare_text("exact", b"1\n", b"1")


def test_float_tolerance_is_token_by_token() -> None:
    assert compare_text("float", b"0.3333333 2\n", b"0.333333333 2")
    assert compare_text("float", b"1e6", b"1000000.0000001")
    assert not compare_text("float", b"0.34", b"0.333333")
    assert compare_text("float", b"nan", b"nan")  # equal tokens are equal, numbers or not
    assert not compare_text("float", b"1 2", b"1 2 3")
    assert not compare_text("float", b"abc", b"abd")


def test_call_results_compare_as_values() -> None:
    """The harness's token line (``_callvalue``): the last line counts, both sides normalised alike."""
    assert compare_call("whitespace", b"noise\nL2 i1 i2\n", [1, 2])
    assert compare_call("whitespace", b"L2 i1 i2\n", [[1, 2]])  # APPS wraps the expected value
    assert compare_call("float", b"d0.30000000000000004\n", 0.3)
    assert not compare_call("whitespace", b"d0.30000000000000004\n", 0.3)
    assert not compare_call("whitespace", b"t\n", 1)  # a bool is not an int
    assert not compare_call("whitespace", b"", None)
    assert not compare_call("whitespace", b"[1, 2]\n", [1, 2])  # JSON is not the harness's line
    assert not compare_call("whitespace", b"L2 i1\n", [1, 2])  # torn


def _compressed(cases: list[dict[str, str]]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def test_livecodebench_compressed_private_cases_are_read_without_running_pickle_code() -> None:
    row = {
        "public_test_cases": json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}]),
        "private_test_cases": _compressed([{"input": "2\n", "output": "2\n", "testtype": "stdin"}]),
        "metadata": "{}",
    }
    problem = from_livecodebench(row)
    assert [c.name for c in problem.cases] == ["public/0", "private/1"]
    assert problem.cases[1].input == "2\n"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("echo pwned",))

    row["private_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(SandboxValidationError, match="refusing to unpickle"):
        from_livecodebench(row)


def test_adapters_reject_rows_of_other_shapes() -> None:
    with pytest.raises(SandboxValidationError):
        from_apps({"input_output": {"inputs": ["1"], "outputs": []}})
    with pytest.raises(SandboxValidationError):
        from_apps({"question": "no tests"})
    with pytest.raises(SandboxValidationError, match="only 'assert f"):
        from_asserts("assert abs(f(1) - 2) < 1e-6")
    with pytest.raises(SandboxValidationError, match="more than one function"):
        from_asserts(["assert f(1) == 1", "assert g(1) == 1"])
    apps = from_apps({"input_output": {"inputs": [["1", "2"]], "outputs": [["3"]]}})  # lists of lines
    assert apps.cases[0].input == "1\n2\n" and apps.cases[0].expected == "3\n"


def test_languages_table_and_extension() -> None:
    assert {"python", "c", "cpp", "java", "javascript", "go", "rust"} <= set(LANGUAGES)
    assert get_language("C++").name == "cpp" and get_language("golang").name == "go"
    assert LANGUAGES["java"].class_name("import x;\npublic final class Solver { }") == "Solver"
    with pytest.raises(SandboxValidationError):
        Language(name="Bad Name", source_file="a", run=("x",), version=("x",))
    with pytest.raises(SandboxValidationError):
        Language(name="ok", source_file="dir/a", run=("x",), version=("x",))
    with pytest.raises(SandboxValidationError):
        get_language("cobol")
