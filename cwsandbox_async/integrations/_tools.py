"""Agent tools: OpenAI-style schemas and their execution in a sandbox, errors turned into observations.

The model's mistakes (bad JSON, a missing argument, an unknown tool, a command
that fails, runs too long, runs out of memory or CPU time, a missing file) come
back as observation strings the agent can read and learn from. Only platform
failures raise: a sandbox that died for outside reasons, a broken transport, a
command starved of CPU by others (``SandboxError`` with ``infrastructure`` True),
so a rollout on a broken sandbox fails instead of teaching the model a fake lesson.

``submit_solution`` runs the code and the tests under the split harness
(``_split``: the tests in their own process, calling the code across a pipe): it
passes only if the tests ran to their end, so a submission that ends the process
early (``os._exit(0)``, ``sys.exit(0)``, an ``atexit`` hook) fails; its
``ToolResult.verdict`` says why (a submission that does not parse is ``compile_error``, with
file, line and the interpreter's message; tests that do not parse raise ``SandboxValidationError``:
the environment's mistake). The run is ``exclusive``: processes the episode left running are killed
first, so they cannot write into its output.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import SandboxError, SandboxFileError, SandboxTimeoutError, SandboxValidationError
from ._extract import clean_text
from ._item import ItemSettings, run_item_with_result
from ._run import programs_doing, run_python
from ._verdicts import CompletionVerdict, VerdictKind

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._types import ExecResult

__all__ = [
    "ALL_TOOLS",
    "BASH_TOOL",
    "CODE_TOOLS",
    "EXECUTE_CODE_TOOL",
    "READ_FILE_TOOL",
    "SHELL_TOOLS",
    "SUBMIT_SOLUTION_TOOL",
    "WRITE_FILE_TOOL",
    "ToolCall",
    "ToolResult",
    "execute_tool",
    "parse_tool_call",
    "run_tool",
    "to_responses_format",
]

#: Observations longer than this keep their head and tail.
MAX_OBSERVATION_CHARS = 8192
#: Largest file ``read_file`` returns to the model.
MAX_READ_BYTES = 1024 * 1024


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
                "required": list(params),
            },
        },
    }


EXECUTE_CODE_TOOL = _tool(
    "execute_code",
    "Run Python code in an isolated sandbox and return its output. Use it to test your solution before "
    "submitting. Returns stdout, or the exit code and error output if it fails.",
    code="Python code to run",
)
SUBMIT_SOLUTION_TOOL = _tool(
    "submit_solution",
    "Submit your final solution; it is run against the hidden tests. You can submit once.",
    code="Your final Python solution",
)
BASH_TOOL = _tool(
    "bash",
    "Run a bash command in the sandbox's working directory and return its output and exit code.",
    command="The command to run",
)
READ_FILE_TOOL = _tool("read_file", "Read a text file from the sandbox.", path="Path (relative to the working dir)")
WRITE_FILE_TOOL = _tool(
    "write_file",
    "Create or overwrite a file in the sandbox (parent directories are created).",
    path="Path (relative to the working dir)",
    content="The file's full new content",
)
CODE_TOOLS: list[dict[str, Any]] = [EXECUTE_CODE_TOOL, SUBMIT_SOLUTION_TOOL]
SHELL_TOOLS: list[dict[str, Any]] = [BASH_TOOL, READ_FILE_TOOL, WRITE_FILE_TOOL]
ALL_TOOLS: list[dict[str, Any]] = [*CODE_TOOLS, *SHELL_TOOLS]


def to_responses_format(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same tools in the OpenAI Responses API's flat, strict format."""
    out = []
    for tool in tools:
        fn = tool["function"]
        params = {**fn["parameters"], "additionalProperties": False}
        out.append(
            {
                "type": "function",
                "name": fn["name"],
                "description": fn["description"],
                "parameters": params,
                "strict": True,
            }
        )
    return out


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call reduced to what running it needs. ``arguments`` is the raw JSON (or a dict)."""

    name: str
    arguments: str | Mapping[str, Any]
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What running a tool call gave: the observation for the model and what it means for the episode.

    ``ok`` is False when the call was malformed or its command failed, timed out or
    hit a file error. ``submitted`` is True for ``submit_solution``; ``passed`` tells
    whether the submission passed its tests (None for other tools), and ``verdict`` why
    (its ``CompletionVerdict``: kind, reason, exit code, times, stderr tail).
    """

    name: str
    observation: str
    ok: bool
    submitted: bool = False
    passed: bool | None = None
    timed_out: bool = False
    verdict: CompletionVerdict | None = None


def parse_tool_call(tool_call: Any) -> ToolCall:
    """Accept a Chat Completions tool call (object or dict), a Responses API function call, or a ``ToolCall``.

    Raises ``SandboxValidationError`` if it has no function name.
    """
    if isinstance(tool_call, ToolCall):
        return tool_call
    get = tool_call.get if isinstance(tool_call, Mapping) else lambda k, d=None: getattr(tool_call, k, d)
    fn = get("function")
    call_id = get("call_id") or get("id")
    if fn is not None:
        fget = fn.get if isinstance(fn, Mapping) else lambda k, d=None: getattr(fn, k, d)
        name, arguments = fget("name"), fget("arguments")
    else:
        name, arguments = get("name"), get("arguments")
    if not isinstance(name, str) or not name:
        raise SandboxValidationError("tool call has no function name")
    if arguments is None:
        arguments = "{}"
    if not isinstance(arguments, (str, Mapping)):
        arguments = str(arguments)
    return ToolCall(name=name, arguments=arguments, id=call_id if isinstance(call_id, str) else None)


def _clip(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n...[{len(text) - limit} characters truncated]...\n{text[-half:]}"


def _status(result: ExecResult) -> str:
    """Why a command failed, in the words the model reads."""
    if result.oom_killed:
        return "killed: out of memory"
    if result.cpu_exceeded:
        return "killed: CPU time limit exceeded"
    return f"killed by signal {result.signal}" if result.signal else f"exit code {result.returncode}"


def _exec_observation(result: ExecResult, ok_text: str = "(no output)", stdout: str | None = None) -> str:
    out, err = (result.stdout if stdout is None else stdout).rstrip(), result.stderr.rstrip()
    if result.returncode == 0 and not result.oom_killed and not result.cpu_exceeded:
        text = out or ok_text
        if err:
            text += f"\n[stderr]\n{err}"
    else:
        details = "\n".join(s for s in (out, err) if s)
        text = f"Error ({_status(result)}):\n{details}" if details else f"Error ({_status(result)})"
    if result.truncated:
        text += "\n[output truncated]"
    return _clip(text)


def _timeout_observation(exc: SandboxTimeoutError, seconds: float) -> str:
    text = f"Error: command timed out after {seconds:g} seconds"
    partial = exc.result
    if partial is not None and (partial.stdout or partial.stderr):
        text += "\nOutput before the timeout:\n" + (partial.stdout + partial.stderr).rstrip()
    return _clip(text)


def _resolve(sandbox: Sandbox, path: str) -> str:
    return path if path.startswith("/") else posixpath.join(sandbox.defaults.working_dir, path)


async def run_tool(
    sandbox: Sandbox,
    tool_call: Any,
    *,
    tests: str | None = None,
    timeout_seconds: float = 30.0,
    python: str = "python3",
) -> ToolResult:
    """Run one tool call in ``sandbox`` and return its observation and meaning.

    Tools: ``execute_code(code)``, ``submit_solution(code)`` (runs ``code`` followed
    by ``tests``), ``bash(command)``, ``read_file(path)``,
    ``write_file(path, content)``. Relative paths resolve against the sandbox's
    working directory. A command past ``timeout_seconds`` is killed and reported as
    ``Error: command timed out after N seconds``; one killed for its memory as
    ``Error (killed: out of memory)``. A submission passes only if its tests ran to
    their end (see the module docstring). Raises only for platform failures (an
    infrastructure ``SandboxError``), the caller's mistakes (a stopped sandbox:
    ``SandboxTerminatedError``; tests that do not compile: ``SandboxValidationError``) and cancellation.
    """
    try:
        call = parse_tool_call(tool_call)
    except SandboxValidationError as exc:
        return ToolResult(name="", observation=f"Error: {exc.message}", ok=False)
    name = call.name
    if isinstance(call.arguments, Mapping):
        args: Any = dict(call.arguments)
    else:
        try:
            args = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolResult(name=name, observation=f"Error: invalid JSON arguments: {exc}", ok=False)
    if not isinstance(args, dict):
        return ToolResult(name=name, observation="Error: tool arguments must be a JSON object", ok=False)
    spec = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in ALL_TOOLS}
    if name not in spec:
        return ToolResult(
            name=name, observation=f"Error: unknown tool {name!r}; available: {', '.join(spec)}", ok=False
        )
    for param in spec[name]:
        if not isinstance(args.get(param), str):
            return ToolResult(name=name, observation=f"Error: missing required string argument {param!r}", ok=False)
        args[param] = clean_text(args[param])  # a lone surrogate cannot be sent; the model sees U+FFFD
    submitted = name == "submit_solution"
    try:
        if submitted:
            if tests is None:
                return ToolResult(name, "Error: this task has no tests to submit against", False, submitted=True)
            return await _submit(sandbox, args["code"], tests, timeout_seconds, python)
        if name == "execute_code":
            result = await run_python(sandbox, args["code"], timeout_seconds=timeout_seconds, python=python)
            return ToolResult(name, _exec_observation(result), result.returncode == 0)
        if name == "bash":
            result = await sandbox.exec(["bash", "-c", args["command"]], timeout_seconds=timeout_seconds)
            return ToolResult(name, _exec_observation(result), result.returncode == 0)
        if name == "read_file":
            data = await sandbox.read_file(_resolve(sandbox, args["path"]), max_bytes=MAX_READ_BYTES)
            return ToolResult(name, _clip(data.decode("utf-8", errors="replace")), True)
        path = _resolve(sandbox, args["path"])
        content = args["content"]
        await sandbox.write_file(path, content)
        return ToolResult(name, f"Wrote {len(content.encode())} bytes to {path}", True)
    except SandboxTimeoutError as exc:
        if exc.infrastructure:
            raise
        observation = _timeout_observation(exc, timeout_seconds)
        verdict = False if submitted else None
        return ToolResult(name, observation, False, submitted=submitted, passed=verdict, timed_out=True)
    except (SandboxFileError, SandboxValidationError) as exc:
        if submitted:
            raise  # the caller's tests do not compile (``_item.judge``): the environment's mistake, not the model's
        path = getattr(exc, "path", None) or args.get("path", "")
        where = "" if path and path in exc.message else f" for {path!r}"
        return ToolResult(name, f"Error: {name} failed{where}: {exc.message}", False)
    except SandboxError as exc:
        if not programs_doing(exc):
            raise  # the platform's failure, the caller's mistake (a stopped sandbox) or a bug
        # The command's own doing (it took its sandbox down with it): the model's outcome.
        verdict = False if submitted else None
        return ToolResult(name, f"Error: {exc.message}", False, submitted=submitted, passed=verdict)


async def _submit(sandbox: Sandbox, code: str, tests: str, timeout_seconds: float, python: str) -> ToolResult:
    """Run ``code`` against ``tests`` under the split harness; passed only if the tests ran to their end.

    A starved run is re-run once (``_item``); one still starved raises ``SandboxTimeoutError``
    (infrastructure), as any platform failure does.
    """
    settings = ItemSettings(
        timeout_seconds=timeout_seconds, python=python, starved_retry_timeout_seconds=4 * timeout_seconds
    )
    verdict, result = await run_item_with_result(sandbox, 0, code, tests, settings)
    if verdict.kind is VerdictKind.STARVED:
        raise SandboxTimeoutError(verdict.reason, sandbox_id=verdict.sandbox_id, result=result, infrastructure=True)
    passed = verdict.kind is VerdictKind.PASSED
    if passed:
        text = "All tests passed."
    else:
        text = f"Tests failed. {verdict.kind.value.replace('_', ' ').capitalize()}: {verdict.reason}"
    if not passed and result is not None:
        details = "\n".join(s for s in (result.stderr.rstrip(), _output(result)) if s)
        text += f"\n{details}" if details else ""
    timed_out = verdict.kind is VerdictKind.TIMEOUT
    return ToolResult(
        "submit_solution", _clip(text), passed, submitted=True, passed=passed, timed_out=timed_out, verdict=verdict
    )


def _output(result: ExecResult) -> str:
    """The tests' own prints (the verdict line is the harness's, not the model's business)."""
    out = result.stdout.rstrip()
    return out[: out.rfind("\ncwsandbox-verdict ")] if "\ncwsandbox-verdict " in out else out


async def execute_tool(
    sandbox: Sandbox, tool_call: Any, *, tests: str | None = None, timeout_seconds: float = 30.0
) -> str:
    """Run one tool call and return only the observation string (see ``run_tool``)."""
    return (await run_tool(sandbox, tool_call, tests=tests, timeout_seconds=timeout_seconds)).observation
