"""Helpers for ART (OpenPipe's Agent Reinforcement Trainer) rollouts in sandboxes.

This module imports without ``art`` installed; only ``require_art`` and
``wandb_run`` touch it. What ART does not do for you, and this module does:

- ART never cancels a rollout when an outer timeout fires (``gather`` runs every
  rollout to its end, and swallows ``CancelledError`` when ``max_exceptions > 0``).
  ``sandbox_rollout`` therefore enforces the rollout's own deadline and releases
  its sandbox in its own ``async with``, whatever happens.
- ``submit_solution`` gives a ``ToolResult`` whose ``verdict`` (a ``CompletionVerdict``)
  says why it passed or failed, as ``code_reward``'s ``last_verdicts`` do.
- Tool calls run with ``execute_tool`` / ``run_tool``: the model's mistakes come
  back as observations (``Error: command timed out after 30 seconds``), platform
  failures raise so ART counts the rollout as an exception, not a zero reward.
- Sandbox metrics go into ART's W&B run: ``Session(run=wandb_run(model))`` and
  ``session.log_metrics(step=...)`` once per training step. ART creates its run
  with ``reinit="create_new"``, which leaves ``wandb.run`` unset, so the run must
  be handed over explicitly.

A rollout in a dozen lines::

    async def rollout(pool, problem) -> art.Trajectory:
        async def episode(sb):
            traj = art.Trajectory(messages_and_choices=[...], tools=CODE_TOOLS, reward=0.0)
            for _ in range(10):
                choice = (await client.chat.completions.create(..., tools=CODE_TOOLS)).choices[0]
                traj.messages_and_choices.append(choice)
                for call in choice.message.tool_calls or []:
                    res = await run_tool(sb, call, tests=problem.tests)
                    traj.messages_and_choices.append(tool_message(call, res.observation))
                    if res.submitted:
                        traj.reward = 1.0 if res.passed else 0.0
                        return traj.finish()
            return traj.finish()
        return await sandbox_rollout(pool, episode, timeout_seconds=300)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .._errors import SandboxError, SandboxTimeoutError, SandboxValidationError
from .._session import Session
from .._validate import validate_timeout
from ..pool import SandboxPool
from ._art_run import wandb_run
from ._tools import (
    ALL_TOOLS,
    BASH_TOOL,
    CODE_TOOLS,
    EXECUTE_CODE_TOOL,
    READ_FILE_TOOL,
    SHELL_TOOLS,
    SUBMIT_SOLUTION_TOOL,
    WRITE_FILE_TOOL,
    ToolCall,
    ToolResult,
    execute_tool,
    parse_tool_call,
    run_tool,
    to_responses_format,
)
from ._verdicts import CompletionVerdict, VerdictKind

if TYPE_CHECKING:
    from .._sandbox import Sandbox

__all__ = [
    "ALL_TOOLS",
    "BASH_TOOL",
    "CODE_TOOLS",
    "CompletionVerdict",
    "EXECUTE_CODE_TOOL",
    "READ_FILE_TOOL",
    "SHELL_TOOLS",
    "SUBMIT_SOLUTION_TOOL",
    "WRITE_FILE_TOOL",
    "RolloutTimeoutError",
    "ToolCall",
    "ToolResult",
    "VerdictKind",
    "execute_tool",
    "parse_tool_call",
    "require_art",
    "run_tool",
    "sandbox_rollout",
    "to_responses_format",
    "tool_message",
    "wandb_run",
]

T = TypeVar("T")


class RolloutTimeoutError(SandboxTimeoutError):
    """A rollout ran past its own deadline and was cancelled (its sandbox was released).

    Not an infrastructure failure: the episode itself took too long.
    """

    def __init__(self, message: str, *, sandbox_id: str | None = None) -> None:
        super().__init__(message, sandbox_id=sandbox_id, infrastructure=False)


def require_art() -> Any:
    """Import and return ``art``; ``SandboxError`` with the install hint if it is missing.

    Sets ``LITELLM_LOCAL_MODEL_COST_MAP=True`` unless set, so the import does not try
    to fetch litellm's cost map from the network (importing art takes several seconds).
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        return importlib.import_module("art")
    except ImportError as exc:
        raise SandboxError("ART is not installed: pip install 'cwsandbox-async[art]'", infrastructure=False) from exc


def tool_message(tool_call: Any, observation: str) -> dict[str, Any]:
    """The ``{"role": "tool", ...}`` message answering ``tool_call`` (for the next request and the trajectory)."""
    call = parse_tool_call(tool_call)
    return {"role": "tool", "tool_call_id": call.id or "", "content": observation}


async def sandbox_rollout(
    source: SandboxPool | Session,
    episode: Callable[[Sandbox], Awaitable[T]],
    *,
    timeout_seconds: float,
    lease_timeout_seconds: float = 60.0,
) -> T:
    """Run ``episode(sandbox)`` in one sandbox, under the rollout's own deadline, and always release it.

    ``source`` is a ``SandboxPool`` (a fresh sandbox is leased, waiting at most
    ``lease_timeout_seconds``) or a ``Session`` (a new sandbox is created). The
    sandbox is returned / stopped by this function's ``async with`` on every exit:
    return, exception, deadline, cancellation. If the episode runs past
    ``timeout_seconds`` it is cancelled and ``RolloutTimeoutError`` is raised;
    ``PoolTimeoutError`` if no sandbox could be leased in time; whatever the
    episode raised otherwise.
    """
    deadline = validate_timeout(timeout_seconds)
    lease_timeout = validate_timeout(lease_timeout_seconds, "lease_timeout_seconds")
    assert deadline is not None
    if isinstance(source, SandboxPool):
        cm: AbstractAsyncContextManager[Sandbox] = source.lease(timeout_seconds=lease_timeout)
    elif isinstance(source, Session):
        cm = source.sandbox()
    else:
        raise SandboxValidationError(f"source must be a SandboxPool or a Session, not {type(source).__name__}")
    async with cm as sandbox:
        with anyio.move_on_after(deadline) as scope:
            return await episode(sandbox)
    assert scope.cancelled_caught
    raise RolloutTimeoutError(f"rollout did not finish within {deadline:g} seconds", sandbox_id=sandbox.sandbox_id)
