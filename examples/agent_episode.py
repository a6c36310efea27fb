"""An agent episode: a tool loop (bash / read_file / write_file) in ONE sandbox, rewarded by a final test command.

Each task puts a small repository in the sandbox. The agent calls tools until it
stops or runs out of turns; the grader then restores the task's test file (so
editing the tests cannot win) and runs the test command: exit 0 is reward 1.0.

The agent's mistakes come back to it as observations, not exceptions: a missing
file, a failing command, a command that hangs (killed at the tool timeout and
reported as ``Error: command timed out after N seconds``). The episode has its own
deadline and its sandbox is released whatever happens.

By default a scripted policy plays the agent, so this runs offline in seconds:

    python examples/agent_episode.py                       # both tasks, local sandboxes
    python examples/agent_episode.py --policy openai --model gpt-4.1-mini [--base-url URL]

Expected: the solvable task ends with reward 1.0, the impossible one with 0.0.
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

import cwsandbox_async as cwa
from cwsandbox_async.integrations.art import SHELL_TOOLS, parse_tool_call, run_tool, sandbox_rollout, tool_message


@dataclass(frozen=True)
class Task:
    name: str
    instruction: str
    files: dict[str, str]
    test_file: str
    test_command: str = "python3 test_calc.py"


CALC = """\
def add(a, b):
    return a - b


def mul(a, b):
    return a * b
"""

TASKS = [
    Task(
        name="solvable",
        instruction="The tests in test_calc.py fail. Fix calc.py so that `python3 test_calc.py` passes.",
        files={"calc.py": CALC},
        test_file="test_calc.py",
    ),
    Task(
        name="impossible",
        instruction="Make `python3 test_calc.py` pass without editing the test.",
        files={"calc.py": CALC},
        test_file="test_calc.py",
    ),
]
TESTS = {
    "solvable": "from calc import add, mul\nassert add(2, 3) == 5\nassert mul(2, 3) == 6\nprint('ok')\n",
    "impossible": "from calc import add\nassert add(2, 2) == 5, 'two plus two is four'\nprint('ok')\n",
}


@dataclass
class Episode:
    """What happened: the conversation, each tool result, and the reward."""

    task: Task
    messages: list[dict[str, Any]] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    reward: float = 0.0


class Policy(Protocol):
    """Returns the next assistant message (OpenAI chat format); no ``tool_calls`` ends the episode."""

    async def act(self, messages: list[dict[str, Any]]) -> dict[str, Any]: ...


class ScriptedPolicy:
    """A deterministic agent: explores, trips over a missing file and a hanging command, then patches the bug.

    It reacts to what it sees: it patches ``a - b`` into ``a + b`` only after reading
    calc.py, and stops once the tests print ``ok`` or its ideas run out.
    """

    def __init__(self) -> None:
        self.turn = 0

    async def act(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        self.turn += 1
        last = str(messages[-1].get("content", "")) if messages[-1]["role"] == "tool" else ""
        seen = "\n".join(str(m.get("content", "")) for m in messages if m["role"] == "tool")
        plan: list[tuple[str, dict[str, str]]] = [
            ("bash", {"command": "ls"}),
            ("read_file", {"path": "NOTES.md"}),  # does not exist: a file error observation
            ("bash", {"command": "python3 test_calc.py"}),
            ("bash", {"command": "sleep 30"}),  # hangs: killed at the tool timeout
            ("read_file", {"path": "calc.py"}),
        ]
        if self.turn <= len(plan):
            name, args = plan[self.turn - 1]
        elif "return a - b" in seen and "Wrote" not in seen:
            name, args = "write_file", {"path": "calc.py", "content": CALC.replace("a - b", "a + b")}
        elif "Wrote" in last:
            name, args = "bash", {"command": "python3 test_calc.py"}
        else:
            return {"role": "assistant", "content": "Done."}  # tests pass, or nothing more to try
        call = {
            "id": f"call_{self.turn}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}


class OpenAIPolicy:
    """A real model through any OpenAI-compatible endpoint (needs ``pip install openai`` and a key)."""

    def __init__(self, model: str, base_url: str | None) -> None:
        from openai import AsyncOpenAI

        self.client = AsyncOpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "not-needed"))
        self.model = model

    async def act(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        resp = await self.client.chat.completions.create(model=self.model, messages=messages, tools=SHELL_TOOLS)
        message: dict[str, Any] = resp.choices[0].message.model_dump(exclude_none=True)
        return message


async def play(
    sb: cwa.Sandbox, task: Task, policy: Policy, ep: Episode, *, max_turns: int, tool_timeout: float
) -> None:
    for path, content in {**task.files, task.test_file: TESTS[task.name]}.items():
        await sb.write_file(f"/workspace/{path}", content)
    ep.messages += [
        {"role": "system", "content": "You are a coding agent. Use the tools; the working directory is /workspace."},
        {"role": "user", "content": task.instruction},
    ]
    for _ in range(max_turns):
        message = await policy.act(ep.messages)
        ep.messages.append(message)
        if not message.get("tool_calls"):
            break
        for raw in message["tool_calls"]:
            call = parse_tool_call(raw)
            result = await run_tool(sb, call, timeout_seconds=tool_timeout)  # never raises for the agent's mistakes
            ep.observations.append(result.observation)
            ep.messages.append(tool_message(call, result.observation))
            first = result.observation.splitlines()[0] if result.observation else ""
            print(f"  [{task.name}] {call.name}({call.arguments}) -> {first[:100]}", flush=True)
    # Grade: restore the test file, then run the test command.
    await sb.write_file(f"/workspace/{task.test_file}", TESTS[task.name])
    final = await sb.exec(["bash", "-c", task.test_command], timeout_seconds=30)
    ep.reward = 1.0 if final.returncode == 0 else 0.0


async def run_episode(session: cwa.Session, task: Task, policy: Policy, *, tool_timeout: float) -> Episode:
    ep = Episode(task)

    async def episode(sb: cwa.Sandbox) -> Episode:
        await play(sb, task, policy, ep, max_turns=12, tool_timeout=tool_timeout)
        return ep

    try:
        return await sandbox_rollout(session, episode, timeout_seconds=120)
    except cwa.SandboxTimeoutError:
        ep.reward = 0.0  # the episode ran past its own deadline: its sandbox was released all the same
        return ep


async def main(args: argparse.Namespace) -> int:
    defaults = cwa.SandboxDefaults(tags=("example:agent-episode",))
    tasks = [t for t in TASKS if args.task in ("all", t.name)]
    results: dict[str, Episode] = {}
    async with cwa.Session(defaults, backend=args.backend) as session:

        async def one(task: Task) -> None:
            policy: Policy = ScriptedPolicy() if args.policy == "scripted" else OpenAIPolicy(args.model, args.base_url)
            results[task.name] = await run_episode(session, task, policy, tool_timeout=args.tool_timeout)

        async with anyio.create_task_group() as tg:
            for task in tasks:
                tg.start_soon(one, task)
        snap = session.snapshot()
    print()
    for task in tasks:
        ep = results[task.name]
        print(f"Task {task.name}: reward {ep.reward:.1f} after {len(ep.observations)} tool calls")
    print(f"Sandbox executions: {snap.executions} (ok {snap.exec_completed_ok}, nonzero {snap.exec_completed_nonzero})")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="local", choices=["local", "kubernetes", "coreweave"])
    parser.add_argument("--task", default="all", choices=["all", *(t.name for t in TASKS)])
    parser.add_argument("--policy", default="scripted", choices=["scripted", "openai"])
    parser.add_argument("--model", default="gpt-4.1-mini")
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--tool-timeout", type=float, default=2.0, help="seconds before a tool command is killed")
    raise SystemExit(anyio.run(main, parser.parse_args()))
