"""``validate_exec``: a caller's exec arguments checked, as the ``ExecRequest`` a backend receives."""

from __future__ import annotations

from ._errors import SandboxValidationError
from ._types import ExecRequest
from ._validate import (
    MAX_FILE_BYTES,
    validate_argv,
    validate_cpu_seconds,
    validate_env,
    validate_path,
    validate_timeout,
)

__all__ = ["validate_exec"]


def validate_exec(
    command: object,
    *,
    timeout_seconds: object,
    cwd: object,
    env: object,
    stdin: object,
    max_output_bytes: object,
    cpu_seconds: object = None,
    exclusive: object = False,
    cpu_priority: object = False,
) -> ExecRequest:
    """Check every exec argument; return the request a backend receives.

    ``cpu_priority=True`` needs ``exclusive=True`` and a ``cpu_seconds`` budget (see
    ``ExecRequest.cpu_priority``); ``SandboxValidationError`` otherwise."""
    argv = validate_argv(command)
    timeout = validate_timeout(timeout_seconds)
    assert timeout is not None
    cwd_s = validate_path(cwd, "cwd")
    if stdin is not None and not isinstance(stdin, (bytes, bytearray, memoryview)):
        raise SandboxValidationError(f"stdin must be bytes, got {type(stdin).__name__}")
    if stdin is not None and len(stdin) > MAX_FILE_BYTES:
        raise SandboxValidationError(f"stdin is larger than {MAX_FILE_BYTES} bytes")
    if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or max_output_bytes <= 0:
        raise SandboxValidationError(f"max_output_bytes must be a positive int, got {max_output_bytes!r}")
    if not isinstance(exclusive, bool):
        raise SandboxValidationError(f"exclusive must be a bool, got {exclusive!r}")
    budget = validate_cpu_seconds(cpu_seconds)
    if not isinstance(cpu_priority, bool):
        raise SandboxValidationError(f"cpu_priority must be a bool, got {cpu_priority!r}")
    if cpu_priority and (not exclusive or budget is None):
        raise SandboxValidationError(
            "cpu_priority=True needs exclusive=True and a cpu_seconds budget: the priority serves only the"
            " command's own processes, for at most its budget of CPU"
        )
    return ExecRequest(
        argv=argv,
        cwd=cwd_s,
        env=validate_env(env),
        stdin=bytes(stdin) if stdin is not None else None,
        timeout_seconds=timeout,
        max_output_bytes=max_output_bytes,
        cpu_seconds=budget,
        exclusive=exclusive,
        cpu_priority=cpu_priority,
    )
