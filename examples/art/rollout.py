"""One ART rollout: a multi-turn tool-calling episode in ONE sandbox, rewarded by the problem's tests.

``rollout`` leases a sandbox from the pool through ``sandbox_rollout``, which
enforces the rollout's own deadline (ART never cancels a rollout from outside)
and releases the sandbox in its own ``async with`` whatever happens. The
trajectory is a real ``art.Trajectory``: the assistant turns are OpenAI
``Choice`` objects (trainable), the tool results ``{"role": "tool"}`` messages.

Policies:
- ``OpenAIPolicy``: any OpenAI-compatible endpoint (ART's served model when training).
- ``ScriptedPolicy``: deterministic, offline. Per (problem, trajectory) it plays one
  of three modes, so the rewards are known in advance:
  ``clean`` tests the canonical solution, then submits it (1.0);
  ``fix`` tests a version with a deliberate bug (the function is misnamed), reads
  the error, tests the fixed version, submits it (1.0);
  ``hasty`` submits the buggy version untested (0.0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from problems import Problem
from tools import TOOLS, call_tool, system_message

from cwsandbox_async.integrations.art import RolloutTimeoutError, require_art, sandbox_rollout, tool_message

MODES = ("clean", "fix", "hasty")
EXPECTED_REWARD = {"clean": 1.0, "fix": 1.0, "hasty": 0.0}


def scripted_mode(problem_number: int, trajectory_index: int) -> str:
    """Which mode the scripted policy plays for this problem and trajectory (deterministic)."""
    return MODES[(problem_number + trajectory_index) % len(MODES)]


@dataclass(frozen=True)
class RolloutConfig:
    max_turns: int = 10
    tool_timeout_seconds: float = 30.0
    rollout_timeout_seconds: float = 300.0
    lease_timeout_seconds: float = 60.0


class Policy(Protocol):
    """Produces the next assistant turn as an OpenAI ``Choice``."""

    async def next_choice(self, messages: list[dict[str, Any]]) -> Any: ...


class OpenAIPolicy:
    def __init__(self, client: Any, model: str) -> None:
        self.client = client
        self.model = model

    async def next_choice(self, messages: list[dict[str, Any]]) -> Any:
        resp = await self.client.chat.completions.create(
            model=self.model, messages=messages, tools=TOOLS, tool_choice="auto", parallel_tool_calls=False
        )
        return resp.choices[0]


def _choice(name: str, code: str, turn: int) -> Any:
    """An assistant turn calling one tool, as the OpenAI client would return it."""
    from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
    from openai.types.chat.chat_completion import Choice
    from openai.types.chat.chat_completion_message_function_tool_call import Function

    call = ChatCompletionMessageFunctionToolCall(
        id=f"call_{turn}", type="function", function=Function(name=name, arguments=json.dumps({"code": code}))
    )
    message = ChatCompletionMessage(role="assistant", content=None, tool_calls=[call])
    return Choice(index=0, message=message, finish_reason="tool_calls")


class ScriptedPolicy:
    """The deterministic policy described in the module docstring (one instance per rollout)."""

    def __init__(self, problem: Problem, mode: str) -> None:
        self.mode = mode
        self.good = problem.solution
        self.buggy = problem.solution.replace(f"def {problem.entry_point}(", f"def {problem.entry_point}_(", 1)
        self.probe = f"\nprint({problem.entry_point}.__name__, 'is defined')\n"
        self.turn = 0

    async def next_choice(self, messages: list[dict[str, Any]]) -> Any:
        self.turn += 1
        last = str(messages[-1].get("content", "")) if messages and messages[-1].get("role") == "tool" else ""
        if self.mode == "hasty":
            return _choice("submit_solution", self.buggy, self.turn)
        if self.mode == "clean":
            steps = [("execute_code", self.good + self.probe), ("submit_solution", self.good)]
            name, code = steps[min(self.turn, len(steps)) - 1]
            return _choice(name, code, self.turn)
        # fix: try the buggy version, read the error, try the fix, submit what worked
        if self.turn == 1:
            return _choice("execute_code", self.buggy + self.probe, self.turn)
        if self.turn == 2:
            fixed = self.good if "Error" in last else self.buggy
            return _choice("execute_code", fixed + self.probe, self.turn)
        return _choice("submit_solution", self.good, self.turn)


async def rollout(
    pool: Any, problem: Problem, policy: Policy, config: RolloutConfig, metadata: dict[str, Any] | None = None
) -> Any:
    """Play one episode and return its ``art.Trajectory`` (reward 1.0 if the submission passed, else 0.0).

    Raises only for platform failures (a sandbox that died, no sandbox to lease):
    ART then counts the rollout as an exception instead of a zero reward.
    """
    art = require_art()
    traj = art.Trajectory(
        messages_and_choices=[
            system_message(problem, config.max_turns),
            {"role": "user", "content": "Solve the problem."},
        ],
        tools=TOOLS,
        reward=0.0,
        metadata={"task_id": problem.task_id, "submitted": False, **(metadata or {})},
        metrics={"tool_calls": 0, "tool_errors": 0, "timed_out": 0},
    )

    async def episode(sandbox: Any) -> None:
        for _ in range(config.max_turns):
            choice = await policy.next_choice(traj.messages())
            traj.messages_and_choices.append(choice)
            calls = choice.message.tool_calls or []
            if not calls:
                return
            for call in calls:
                result = await call_tool(sandbox, call, problem, config.tool_timeout_seconds)
                traj.messages_and_choices.append(tool_message(call, result.observation))
                traj.metrics["tool_calls"] += 1
                traj.metrics["tool_errors"] += 0 if result.ok else 1
                if result.submitted:
                    traj.metadata["submitted"] = True
                    traj.reward = 1.0 if result.passed else 0.0
                    if result.verdict is not None:  # why it scored what it did
                        traj.metadata["verdict"] = str(result.verdict.kind)
                        traj.log(f"verdict: {result.verdict.kind} ({result.verdict.reason})")
                    return

    try:
        async with traj.track_duration("sandbox"):
            await sandbox_rollout(
                pool,
                episode,
                timeout_seconds=config.rollout_timeout_seconds,
                lease_timeout_seconds=config.lease_timeout_seconds,
            )
    except RolloutTimeoutError:
        traj.metrics["timed_out"] = 1  # reward stays 0.0: the episode itself took too long
    return traj.finish()
