"""Bad input raises SandboxValidationError before anything reaches a backend."""

from __future__ import annotations

import math
from typing import Any

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.testing import FakeBackend

BAD_EXEC: list[tuple[Any, dict[str, Any]]] = [
    ([], {}),
    ("", {}),
    ("   ", {}),
    ([""], {}),
    (["echo", 3], {}),
    (["echo", b"x"], {}),
    (b"echo", {}),
    (["echo", "a\x00b"], {}),
    ("echo \x00", {}),
    (["echo"], {"timeout_seconds": -1}),
    (["echo"], {"timeout_seconds": 0}),
    (["echo"], {"timeout_seconds": math.nan}),
    (["echo"], {"timeout_seconds": math.inf}),
    (["echo"], {"timeout_seconds": "5"}),
    (["echo"], {"timeout_seconds": True}),
    (["echo"], {"cwd": "relative/dir"}),
    (["echo"], {"cwd": "/tmp/\x00"}),
    (["echo"], {"env": {"BAD NAME": "x"}}),
    (["echo"], {"env": {"OK": 1}}),
    (["echo"], {"env": ["A=1"]}),
    (["echo"], {"stdin": "text"}),
    (["echo"], {"max_output_bytes": 0}),
    (["x" * (1024 * 1024 + 1)], {}),
]


@pytest.mark.parametrize(("command", "kwargs"), BAD_EXEC)
async def test_bad_exec_input(command: Any, kwargs: dict[str, Any]) -> None:
    backend = FakeBackend()
    async with cwa.Session(backend=backend) as s:
        sb = await s.sandbox()
        with pytest.raises(cwa.SandboxValidationError):
            await sb.exec(command, **kwargs)
        assert backend.exec_count == 0
        assert sb.exec_stats["exec_count"] == 0


@pytest.mark.parametrize("path", ["", "relative.txt", "a/../b", "/tmp/\x00x", 42, None, "/" + "a" * 5000])
async def test_bad_paths(path: Any) -> None:
    async with cwa.Session(backend="fake") as s:
        sb = await s.sandbox()
        with pytest.raises(cwa.SandboxValidationError):
            await sb.read_file(path)
        with pytest.raises(cwa.SandboxValidationError):
            await sb.write_file(path, b"x")


async def test_bad_file_data_and_oversized_write() -> None:
    async with cwa.Session(backend="fake") as s:
        sb = await s.sandbox()
        with pytest.raises(cwa.SandboxValidationError):
            await sb.write_file("/workspace/x", 123)  # type: ignore[arg-type]
        big = memoryview(bytearray(256 * 1024 * 1024 + 1))
        with pytest.raises(cwa.SandboxValidationError):
            await sb.write_file("/workspace/x", big)  # type: ignore[arg-type]


def test_paths_are_normalised() -> None:
    from cwsandbox_async._validate import validate_path

    assert validate_path("/workspace/../etc/passwd") == "/etc/passwd"
    assert validate_path("//workspace//a/./b") == "/workspace/a/b"


@pytest.mark.parametrize(
    "overrides",
    [
        {"tags": "run:abc"},
        {"tags": ["bad tag with spaces"]},
        {"tags": [1]},
        {"no_such_option": 1},
        {"working_dir": "workspace"},
        {"exec_timeout_seconds": -5},
        {"max_lifetime_seconds": 0},
        {"network": "yes"},
        {"resources": {"memory_mib": -1}},
        {"resources": {"bogus": 1}},
        {"max_output_bytes": -1},
        {"image": ""},
        {"env": {"A": None}},
    ],
)
def test_bad_defaults(overrides: dict[str, Any]) -> None:
    with pytest.raises(cwa.SandboxValidationError):
        cwa.SandboxDefaults().with_overrides(**overrides)


def test_defaults_constructor_validates() -> None:
    with pytest.raises(cwa.SandboxValidationError):
        cwa.SandboxDefaults(tags="run:abc")  # type: ignore[arg-type]
    d = cwa.SandboxDefaults(tags=["a", "b"], resources={"memory_mib": 64})  # type: ignore[arg-type]
    assert d.tags == ("a", "b") and d.resources.memory_mib == 64


def test_validation_error_is_a_value_error() -> None:
    assert issubclass(cwa.SandboxValidationError, ValueError)
    assert issubclass(cwa.SandboxValidationError, cwa.SandboxError)


async def test_lone_surrogates_are_validation_errors() -> None:
    async with cwa.Session(backend="fake") as s:
        sb = await s.sandbox()
        with pytest.raises(cwa.SandboxValidationError):
            await sb.exec(["echo", "\ud800"])
        with pytest.raises(cwa.SandboxValidationError):
            await sb.exec("echo \ud800")
        with pytest.raises(cwa.SandboxValidationError):
            await sb.write_file("/workspace/x", "\ud800")
        with pytest.raises(cwa.SandboxValidationError):
            await sb.exec(["echo"], env={"A": "\udfff"})


# -- one rule for every timeout: None is the default, 0 / negatives / NaN raise ------------------
BAD_SECONDS = [0, 0.0, -1, -0.5, math.nan, "5", True]


@pytest.mark.parametrize("seconds", BAD_SECONDS)
async def test_file_timeouts_follow_the_rule(seconds: Any) -> None:
    """``read_file(timeout_seconds=0)`` used to mean "the default"; now it raises, as exec's does."""
    backend = FakeBackend()
    async with cwa.Session(backend=backend) as s:
        sb = await s.sandbox()
        await sb.write_file("/workspace/x", b"1")
        with pytest.raises(cwa.SandboxValidationError):
            await sb.read_file("/workspace/x", timeout_seconds=seconds)
        with pytest.raises(cwa.SandboxValidationError):
            await sb.write_file("/workspace/x", b"2", timeout_seconds=seconds)
        assert await sb.read_file("/workspace/x", timeout_seconds=None) == b"1"  # None: the default
        with pytest.raises(cwa.SandboxValidationError):
            await sb.read_file("/workspace/x", max_bytes=0)


@pytest.mark.parametrize("field", ["exec_grace_seconds", "stop_seconds", "close_seconds"])
@pytest.mark.parametrize("seconds", [*BAD_SECONDS, math.inf])
def test_timeouts_follow_the_rule(field: str, seconds: Any) -> None:
    with pytest.raises(cwa.SandboxValidationError, match=field):
        cwa.Timeouts(**{field: seconds})


def test_timeouts_defaults_and_none() -> None:
    default = cwa.Timeouts()
    assert cwa.Timeouts(stop_seconds=None, close_concurrency=None) == default  # type: ignore[arg-type]
    assert cwa.Timeouts(close_seconds=5).close_seconds == 5.0
    for bad in (0, -1, 1.5, True):
        with pytest.raises(cwa.SandboxValidationError, match="close_concurrency"):
            cwa.Timeouts(close_concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(cwa.SandboxValidationError, match="timeouts"):
        cwa.Session(backend="fake", timeouts={"close_seconds": 5})  # type: ignore[arg-type]


def test_validate_timeout_rule() -> None:
    from cwsandbox_async._validate import validate_timeout

    assert validate_timeout(None, default=7.0) == 7.0
    assert validate_timeout(None, allow_none=True) is None
    assert validate_timeout(math.inf, allow_inf=True) == math.inf
    with pytest.raises(cwa.SandboxValidationError, match="required"):
        validate_timeout(None)
    with pytest.raises(cwa.SandboxValidationError, match="finite"):
        validate_timeout(math.inf)
    for bad in BAD_SECONDS:
        with pytest.raises(cwa.SandboxValidationError):
            validate_timeout(bad, default=7.0, allow_inf=True)
