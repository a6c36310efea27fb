"""Score five model completions in sandboxes, concurrently, and print rewards as they finish.

The async version of the reward-function example users know: one sandbox per
completion, all run at once, each result printed the moment it is ready
(fastest first), then a summary in the original order.

    python examples/reward_function.py [--backend local|kubernetes|coreweave] [--image IMAGE]

A completion whose sandbox could not run it (an error, not a verdict) is printed with the error
and left unscored (``None``), never counted as a wrong answer. Kubernetes and CoreWeave need an
image with ``python3`` (default ``python:3.12-slim``); the local backend runs the host's.
"""

from __future__ import annotations

import argparse
import textwrap

import anyio

import cwsandbox_async as cwa

PROBLEMS: list[tuple[str, str, str]] = [
    (
        "slow-sum",
        """
        import time
        def solve(xs):
            time.sleep(0.6)
            return sum(xs)
        """,
        "assert solve([1, 2, 3]) == 6",
    ),
    (
        "string-ops",
        """
        def solve(s):
            return s[::-1].upper()
        """,
        "assert solve('abc') == 'CBA'",
    ),
    (
        "delayed-error",
        """
        import time
        def solve(x):
            time.sleep(0.3)
            raise ValueError('model forgot the base case')
        """,
        "assert solve(3) == 6",
    ),
    (
        "syntax-error",
        """
        def solve(x:
            return x
        """,
        "assert solve(1) == 1",
    ),
    (
        "slow-list",
        """
        import time
        def solve(xs):
            time.sleep(0.9)
            return sorted(xs)
        """,
        "assert solve([3, 1, 2]) == [1, 2, 3]",
    ),
]


async def score(session: cwa.Session, code: str, test: str) -> float:
    """1.0 if the completion passes its test, else 0.0. Runs in its own sandbox."""
    program = textwrap.dedent(code) + "\n" + test + "\n"
    async with session.sandbox() as sb:
        await sb.write_file("/workspace/solution.py", program)
        result = await sb.exec(["python3", "solution.py"], timeout_seconds=10)
    return 1.0 if result.returncode == 0 else 0.0


async def main(backend: str, image: str | None) -> None:
    if image is None and backend != "local":
        image = "python:3.12-slim"
    defaults = cwa.SandboxDefaults(tags=("example:reward-function",), image=image)
    async with cwa.Session(defaults, backend=backend) as session:
        rewards: dict[int, float | None] = {}
        work = [lambda code=code, test=test: score(session, code, test) for _, code, test in PROBLEMS]
        async with cwa.as_completed(work, limit=len(work), timeout_seconds=30) as results:
            async for outcome in results:
                name = PROBLEMS[outcome.index][0]
                reward = outcome.value if outcome.ok else None
                rewards[outcome.index] = reward
                verdict = "PASS" if reward == 1.0 else "FAIL" if reward == 0.0 else f"NOT SCORED: {outcome.error!r}"
                print(f"[{len(rewards)}/{len(work)}] Problem {outcome.index} ({name}): {verdict}", flush=True)

    print("\nSummary:")
    for i, (name, _, _) in enumerate(PROBLEMS):
        shown = "not scored" if rewards[i] is None else f"{rewards[i]:.1f}"
        print(f"  Problem {i} ({name}): reward {shown}")
    total = sum(r for r in rewards.values() if r is not None)
    passed = sum(1 for r in rewards.values() if r == 1.0)
    print(f"Total reward: {total:.1f}/{len(PROBLEMS)}")
    print(f"Pass rate: {passed}/{len(PROBLEMS)} ({100 * passed // len(PROBLEMS)}%)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="local", choices=["local", "kubernetes", "coreweave"])
    parser.add_argument("--image", default=None, help="the sandbox image (Kubernetes, CoreWeave)")
    args = parser.parse_args()
    anyio.run(main, args.backend, args.image)
