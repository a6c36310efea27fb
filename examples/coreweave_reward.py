"""CoreWeave's RL-training guide, reward-function flow, on ``backend="coreweave"``.

The guide's sync SDK example ported call by call (docs/coreweave.md maps each one):
five model completions, each scored in its own sandbox, collected as they finish
with ``cwa.wait(..., num_returns=1)``; active sandboxes counted with
``session.list(status="running")``; per-step metrics flushed with
``session.log_metrics(step=...)`` (W&B gets ``cwsandbox/step``).

    CWSANDBOX_API_KEY=... python examples/coreweave_reward.py
    CWSANDBOX_BASE_URL=http://127.0.0.1:PORT python examples/coreweave_reward.py  # a local test server

Without ``CWSANDBOX_API_KEY`` only an ``http://`` test endpoint is accepted.
"""

from __future__ import annotations

import asyncio
import textwrap

import cwsandbox_async as cwa

TAGS = ("rl-training", "reward-fn")
COMPLETIONS = [
    ("add", "def add(a, b):\n    return a + b", "assert add(2, 3) == 5"),
    ("reverse", "def reverse(s):\n    return s[::-1]", "assert reverse('abc') == 'cba'"),
    ("off-by-one", "def last(xs):\n    return xs[len(xs)]", "assert last([1, 2]) == 2"),
    ("early-exit", "import sys\nsys.exit(0)", "assert False, 'never reached'"),
    ("loops-forever", "while True:\n    pass", "assert True"),
]


async def reward(sb: cwa.Sandbox, name: str, code: str, test: str) -> tuple[str, float]:
    """1.0 if the completion's test passes in its own fresh sandbox (stopped after); 0.0 for a failure or timeout."""
    async with sb:
        await sb.write_file("/workspace/solution.py", textwrap.dedent(code) + "\n" + test + "\n")
        # the verdict file is written only after the test ran, so an early exit(0) does not pass
        script = "exec(open('/workspace/solution.py').read()); open('/workspace/verdict', 'w').write('pass')"
        try:
            result = await sb.exec(["python3", "-c", script], timeout_seconds=5)
        except cwa.SandboxTimeoutError:
            return name, 0.0
        try:
            verdict = await sb.read_file("/workspace/verdict")
        except cwa.SandboxFileError as exc:  # .filepath is the SDK's name for .path
            print(f"{name:14s} wrote no {exc.filepath} (exit {result.returncode})")
            return name, 0.0
        return name, 1.0 if result.returncode == 0 and verdict == b"pass" else 0.0


async def main() -> None:
    defaults = cwa.SandboxDefaults(container_image="python:3.11", tags=TAGS)  # the SDK's spelling
    async with cwa.Session(defaults, backend="coreweave", report_to=[]) as session:
        sandboxes = await asyncio.gather(*(session.sandbox() for _ in COMPLETIONS))
        running = await session.list(tags=list(TAGS), status="running")
        print(f"active sandboxes: {len(running)}")
        pending = [asyncio.ensure_future(reward(sb, *c)) for sb, c in zip(sandboxes, COMPLETIONS, strict=True)]
        rewards: dict[str, float] = {}
        while pending:
            done, pending = await cwa.wait(pending, num_returns=1)
            for task in done:
                name, value = task.result()
                rewards[name] = value
                print(f"{name:14s} reward={value}")
        print("rewards:", [rewards[name] for name, _, _ in COMPLETIONS])
        metrics = session.get_metrics()
        print(f"executions={metrics['cwsandbox/executions']} created={metrics['cwsandbox/sandboxes_created']}")
        session.log_metrics(step=0)
    print("left running:", len([i for i in await _left(defaults)]))


async def _left(defaults: cwa.SandboxDefaults) -> list[cwa.SandboxInfo]:
    async with cwa.Session(defaults, backend="coreweave") as session:
        return await session.list()


if __name__ == "__main__":
    asyncio.run(main())
