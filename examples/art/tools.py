"""The rollout's tools: ``execute_code`` and ``submit_solution``, run in the rollout's sandbox.

The schemas and their execution come from ``cwsandbox_async.integrations.art``:
``run_tool`` turns the model's mistakes (bad JSON, a failing or hanging program)
into observations it can learn from, and raises only when the platform fails.
"""

from __future__ import annotations

from typing import Any

from problems import Problem

from cwsandbox_async.integrations.art import CODE_TOOLS, ToolResult, run_tool, to_responses_format

TOOLS: list[dict[str, Any]] = CODE_TOOLS
TOOLS_RESPONSES = to_responses_format(TOOLS)
TOOL_TIMEOUT_SECONDS = 30.0

SYSTEM_PROMPT = """You solve Python coding problems.

Tools:
- execute_code(code): run Python in a sandbox and see its output; test as often as you like.
- submit_solution(code): submit your final solution once; it is run against hidden tests.

Write the complete function `{entry_point}` (with its imports). At most {max_turns} tool calls.

Problem:
{prompt}"""


def system_message(problem: Problem, max_turns: int) -> dict[str, str]:
    text = SYSTEM_PROMPT.format(entry_point=problem.entry_point, max_turns=max_turns, prompt=problem.prompt)
    return {"role": "system", "content": text}


async def call_tool(sandbox: Any, tool_call: Any, problem: Problem, timeout_seconds: float) -> ToolResult:
    """Run one tool call; ``submit_solution`` runs the code followed by the problem's tests."""
    return await run_tool(sandbox, tool_call, tests=problem.tests, timeout_seconds=timeout_seconds)
