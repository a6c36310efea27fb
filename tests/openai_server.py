"""An OpenAI-compatible chat completions server on 127.0.0.1, answered by a scripted agent.

It speaks the wire format the ``openai`` client sees (``POST /v1/chat/completions``
with JSON in and a ``chat.completion`` object out, tool calls included) so the
README's agent snippets run unchanged against it, with ``OPENAI_BASE_URL`` pointed
here. Every request is recorded in ``requests``.

The scripted agent plays a fixed, known-good episode per toolset, by counting the
tool results already in the conversation:

- ``submit_solution`` offered (``CODE_TOOLS``): test ``add`` with ``execute_code``,
  then submit it;
- ``bash`` offered (``SHELL_TOOLS``): read ``test.py``, write ``calc.py``, run the
  tests, then answer without tool calls.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from typing import Any

from aiohttp import web

__all__ = ["SOLUTION", "ScriptedChatServer"]

SOLUTION = "def add(a, b):\n    return a + b\n"

_CODE_EPISODE = [
    ("execute_code", {"code": SOLUTION + "print(add(2, 3))"}),
    ("submit_solution", {"code": SOLUTION}),
]
_SHELL_EPISODE = [
    ("bash", {"command": "cat test.py"}),
    ("write_file", {"path": "calc.py", "content": SOLUTION}),
    ("bash", {"command": "python3 test.py && echo PASSED"}),
]


class ScriptedChatServer:
    """``await start()`` returns the base URL (ending in ``/v1``); ``await stop()`` closes it."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _next_call(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        episode = _CODE_EPISODE if "submit_solution" in tools else _SHELL_EPISODE if "bash" in tools else []
        done = sum(1 for m in body["messages"] if m.get("role") == "tool")
        return episode[done] if done < len(episode) else None

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        n = next(self._ids)
        call = self._next_call(body)
        message: dict[str, Any] = {"role": "assistant", "content": None if call else "Done: the tests pass."}
        if call is not None:
            name, args = call
            message["tool_calls"] = [
                {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ]
        return web.json_response(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if call else "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )
