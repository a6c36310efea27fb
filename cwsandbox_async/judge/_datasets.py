"""Dataset adapters: the row shapes people train on, as the judge's test cases (``Problem``).

- **APPS / TACO**: ``input_output`` (a JSON string or dict) with ``inputs`` and ``outputs``
  (each a str, or a list of lines), and optional ``fn_name``: then the problem is call-based and
  every input is the argument list, every output the return value (APPS wraps it: ``[x]``).
- **CodeContests**: ``public_tests`` / ``private_tests`` / ``generated_tests``, each
  ``{"input": [...], "output": [...]}``; choose the splits with ``splits=``.
- **LiveCodeBench**: ``public_test_cases`` / ``private_test_cases`` (a JSON list of
  ``{"input", "output", "testtype"}``; the hub's private cases may be the zlib-compressed,
  base64 pickled form, read here without running any pickle code) and ``metadata`` with
  ``func_name`` for ``testtype == "functional"`` (one JSON value per argument, one per line).
- **asserts** (HumanEval/MBPP): ``assert f(args) == value`` lines (or ``assert f(args)`` /
  ``assert not f(args)``, and ``candidate`` inside HumanEval's ``check``) become call-based
  cases, so the comparison happens in the driver, not in the program's process. An assert of
  another shape raises ``SandboxValidationError`` naming it.

Every adapter raises ``SandboxValidationError`` for a row that does not have its shape.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import pickle
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import SandboxValidationError
from ._problem import Problem
from ._types import TestCase

__all__ = ["from_apps", "from_asserts", "from_codecontests", "from_livecodebench", "from_taco"]

CODECONTESTS_SPLITS = ("public", "private", "generated")


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return "\n".join(value) + ("\n" if value and not value[-1].endswith("\n") else "")
    raise SandboxValidationError(f"{what} must be a str or a list of str, got {type(value).__name__}")


def _json(value: Any, what: str) -> Any:
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise SandboxValidationError(f"{what} is not valid JSON: {exc}") from None
    return value


def from_apps(row: Mapping[str, Any], *, name: str = "") -> Problem:
    """Cases of an APPS row (``input_output``; ``fn_name`` inside it or in the row makes it call-based)."""
    if not isinstance(row, Mapping) or "input_output" not in row:
        raise SandboxValidationError("an APPS/TACO row needs an 'input_output' field")
    io_ = _json(row["input_output"], "input_output")
    if (
        not isinstance(io_, Mapping)
        or not isinstance(io_.get("inputs"), list)
        or not isinstance(io_.get("outputs"), list)
    ):
        raise SandboxValidationError("input_output must hold 'inputs' and 'outputs' lists")
    inputs, outputs = io_["inputs"], io_["outputs"]
    if len(inputs) != len(outputs):
        raise SandboxValidationError(f"input_output has {len(inputs)} inputs but {len(outputs)} outputs")
    fn_name = io_.get("fn_name") or row.get("fn_name") or None
    if fn_name is not None and not isinstance(fn_name, str):
        raise SandboxValidationError("fn_name must be a str")
    cases = []
    for i, (inp, out) in enumerate(zip(inputs, outputs, strict=True)):
        if fn_name:
            args = inp if isinstance(inp, list) else [inp]
            cases.append(TestCase(args, out, name=f"{i}", call=True))
        else:
            cases.append(TestCase(_text(inp, f"inputs[{i}]"), _text(out, f"outputs[{i}]"), name=f"{i}"))
    return Problem(tuple(cases), fn_name=fn_name, name=name or str(row.get("problem_id", "")))


#: TACO rows have APPS's shape.
from_taco = from_apps


def from_codecontests(
    row: Mapping[str, Any], *, splits: Sequence[str] = CODECONTESTS_SPLITS, name: str = ""
) -> Problem:
    """Cases of a CodeContests row, ``public`` then ``private`` then ``generated`` (as ``splits`` lists)."""
    if not isinstance(row, Mapping):
        raise SandboxValidationError("a CodeContests row must be a mapping")
    cases = []
    for split in splits:
        if split not in CODECONTESTS_SPLITS:
            raise SandboxValidationError(f"unknown CodeContests split {split!r}; one of {CODECONTESTS_SPLITS}")
        tests = row.get(f"{split}_tests")
        if tests is None:
            continue
        if (
            not isinstance(tests, Mapping)
            or not isinstance(tests.get("input"), list)
            or not isinstance(tests.get("output"), list)
        ):
            raise SandboxValidationError(f"{split}_tests must be {{'input': [...], 'output': [...]}}")
        if len(tests["input"]) != len(tests["output"]):
            raise SandboxValidationError(f"{split}_tests has unequal input and output lists")
        for i, (inp, out) in enumerate(zip(tests["input"], tests["output"], strict=True)):
            cases.append(TestCase(_text(inp, f"{split} input"), _text(out, f"{split} output"), name=f"{split}/{i}"))
    if not cases:
        raise SandboxValidationError(f"the CodeContests row has no tests in {list(splits)}")
    return Problem(tuple(cases), name=name or str(row.get("name", "")))


class _StrOnly(pickle.Unpickler):
    """Loads a pickle that holds only plain data; any class or function in it is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise SandboxValidationError(f"refusing to unpickle {module}.{name} from a dataset row")


def _lcb_cases(value: Any, what: str) -> list[Any]:
    if isinstance(value, str) and value and value.lstrip()[:1] not in ("[", "{"):
        try:
            raw = zlib.decompress(base64.b64decode(value))
            value = _StrOnly(io.BytesIO(raw)).load()
        except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as exc:
            raise SandboxValidationError(f"{what} is neither JSON nor LiveCodeBench's compressed form: {exc}") from None
    value = _json(value, what)
    if not isinstance(value, list) or not all(isinstance(c, Mapping) for c in value):
        raise SandboxValidationError(f"{what} must be a list of {{'input', 'output', 'testtype'}}")
    return value


def from_livecodebench(row: Mapping[str, Any], *, private: bool = True, name: str = "") -> Problem:
    """Cases of a LiveCodeBench row: public, then (``private``) private test cases."""
    if not isinstance(row, Mapping) or "public_test_cases" not in row:
        raise SandboxValidationError("a LiveCodeBench row needs 'public_test_cases'")
    metadata = _json(row.get("metadata") or {}, "metadata")
    fn_name = metadata.get("func_name") if isinstance(metadata, Mapping) else None
    found = [("public", c) for c in _lcb_cases(row["public_test_cases"], "public_test_cases")]
    if private and row.get("private_test_cases"):
        found += [("private", c) for c in _lcb_cases(row["private_test_cases"], "private_test_cases")]
    cases = []
    for i, (split, case) in enumerate(found):
        kind = case.get("testtype", "stdin")
        if kind == "functional":
            if not fn_name:
                raise SandboxValidationError("a functional LiveCodeBench case needs metadata.func_name")
            args = [_json(line, "a functional input line") for line in str(case["input"]).split("\n") if line.strip()]
            cases.append(TestCase(args, _json(case["output"], "a functional output"), name=f"{split}/{i}", call=True))
        elif kind == "stdin":
            cases.append(TestCase(str(case["input"]), str(case["output"]), name=f"{split}/{i}"))
        else:
            raise SandboxValidationError(f"unknown LiveCodeBench testtype {kind!r}")
    if any(c.call for c in cases) and not all(c.call for c in cases):
        raise SandboxValidationError("a LiveCodeBench row mixes functional and stdin cases")
    return Problem(
        tuple(cases), fn_name=fn_name if cases and cases[0].call else None, name=name or str(row.get("question_id", ""))
    )


def _literal(node: ast.expr, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        raise SandboxValidationError(f"assert {text!r}: only literal arguments and values can be judged") from None


def _call_case(test: ast.expr, entry: str | None, text: str, i: int) -> tuple[str, TestCase]:
    expected: Any = True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.Is)):
        call, expected = test.left, _literal(test.comparators[0], text)
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        call, expected = test.operand, False
    else:
        call = test
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.keywords:
        raise SandboxValidationError(f"assert {text!r}: only 'assert f(literals) == literal' can be judged")
    fn = call.func.id
    if fn == "candidate":
        if entry is None:
            raise SandboxValidationError("asserts on 'candidate' need entry_point=")
        fn = entry
    args = [_literal(a, text) for a in call.args]
    return fn, TestCase(args, expected, name=f"assert/{i}", call=True)


def from_asserts(tests: str | Sequence[str], *, entry_point: str | None = None) -> Problem:
    """Call-based cases from assert-style tests (one str, or MBPP's ``test_list``)."""
    source = tests if isinstance(tests, str) else "\n".join(tests)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise SandboxValidationError(f"the tests do not parse: {exc}") from None
    found: list[tuple[str, TestCase]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found.append(_call_case(node.test, entry_point, ast.unparse(node.test), len(found)))
    if not found:
        raise SandboxValidationError("no assert found in the tests")
    names = {fn for fn, _ in found}
    if len(names) != 1:
        raise SandboxValidationError(f"the asserts call more than one function: {sorted(names)}")
    return Problem(tuple(c for _, c in found), fn_name=names.pop())
