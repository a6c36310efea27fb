"""The scoring paths (the matrix's columns): each scores one attack and says what it saw.

A path is a **mechanism** (how a completion is scored: ``code_reward``'s split or in-process
harness, the judge through ``code_reward(judge=...)`` in Python, C++, call-based or with a
``Checker``, ART's ``submit_solution`` tool) in a **mode**:

- ``fresh``: a fresh sandbox per completion. The ``code_reward`` mechanisms score every attack of
  the path as one batch (their real path); should the batch raise, each attack is scored alone
  so the raise is charged to the attack that caused it. ART writes an attack's ``files`` with its
  ``write_file`` tool first (same episode, same sandbox); the other mechanisms have no earlier step.
- ``reused``: one sandbox for a sequence of completions: an honest correct one (it leaves what a
  completion leaves), the attack (after ``Attack.files`` are written, as an earlier completion or
  ART's ``write_file`` could), then a wrong one and a correct one. The neighbours must score 0.0
  and 1.0 whatever the attack did: an earlier completion must not move a later one's score.

Every mechanism answers with ``Seen`` (score, kind, reason, or what the scoring call raised);
nothing here decides what is right (that is the corpus's ``Attack.score`` / ``kind``).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from cwsandbox_async.integrations._reward import RewardCore
from cwsandbox_async.integrations._tools import ToolCall, run_tool
from cwsandbox_async.integrations._verdicts import CompletionVerdict
from cwsandbox_async.judge import Checker, JudgeOptions, Limits

from .corpus import CORRECT, WRONG, Attack, Shape
from .tasks import SUM, Task

if TYPE_CHECKING:
    from cwsandbox_async import Sandbox, Session

__all__ = ["PATHS", "Outcome", "Path", "Seen"]

#: The function paths' timeout (s): the CPU-bound control needs well under it.
TIMEOUT_SECONDS = 3.0
#: The judge's per-case limits: a 1 s CPU limit, a 3 s wall limit.
JUDGE_LIMITS = Limits(time_seconds=1.0, memory_mib=256, wall_factor=2.0, wall_extra_seconds=1.0)
#: The judge paths' ``timeout_seconds`` and lease wait as a caller thinking "1 s per case" sets them;
#: the item deadline must still come from the judge's own budgets (cases x limits + compile + reruns).
JUDGE_REWARD_TIMEOUT = 1.0
#: Items of a batch (or reused sandboxes) in flight at once: most attacks wait on a timeout.
CONCURRENCY = 3
#: A guard on one sequence or batch, past every budget above: a hang is reported, never waited out.
GUARD_SECONDS = 400.0

CHECKER = Checker(
    "import sys\ngot, want = (open(path).read().split() for path in sys.argv[2:4])\nsys.exit(0 if got == want else 1)\n"
)


@dataclass(frozen=True, slots=True)
class Seen:
    """What a path said about one completion: its score, verdict kind and reason, or the raise."""

    score: float | None
    kind: str | None
    reason: str
    raised: str | None = None

    def describe(self) -> str:
        if self.raised is not None:
            return f"the scoring call raised {self.raised}"
        return f"score {self.score!r} ({self.kind}): {self.reason}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """An attack's ``Seen`` and, in a reused sandbox, its neighbours': ``(label, expected, seen)``."""

    attack: Seen
    neighbours: tuple[tuple[str, float, Seen], ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """One completion: its program, task and fence tag."""

    code: str
    task: Task
    fence: str | None = None


def _seen(v: CompletionVerdict) -> Seen:
    return Seen(v.score, str(v.kind), v.reason.strip()[:600])


def _raised(exc: BaseException) -> Seen:
    """The raise, with where it happened: the deepest frame in the library, and the last one."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    ours = [f for f in frames if "/cwsandbox_async/" in f.filename][-1:]
    at = "".join(f" at {'/'.join(f.filename.split('/')[-2:])}:{f.lineno} ({f.name})" for f in ours + frames[-1:])
    return Seen(None, None, "", raised=f"{type(exc).__name__}: {str(exc)[:400]}{at}")


@contextlib.asynccontextmanager
async def _same(sb: Sandbox) -> AsyncIterator[Sandbox]:
    yield sb


class Mechanism(Protocol):
    name: str
    shape: Shape

    async def fresh(self, session: Session, steps: list[Step]) -> list[Seen]: ...

    async def one(self, session: Session, sb: Sandbox, step: Step) -> Seen: ...

    async def plant(self, sb: Sandbox, files: dict[str, str]) -> None: ...


async def _each(items: list[Any], run: Callable[[Any], Awaitable[Seen]]) -> list[Seen]:
    """``run`` on every item, ``CONCURRENCY`` at a time, in order; a raise is that item's ``Seen``."""
    out: list[Seen | None] = [None] * len(items)
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def one(i: int) -> None:
        async with limiter:
            try:
                with anyio.fail_after(GUARD_SECONDS):
                    out[i] = await run(items[i])
            except Exception as exc:
                out[i] = _raised(exc)

    async with anyio.create_task_group() as tg:
        for i in range(len(items)):
            tg.start_soon(one, i)
    return [s if s is not None else Seen(None, None, "", raised="no result") for s in out]


class _RewardMechanism:
    """A ``RewardCore`` (what ``code_reward`` runs) over completions in a fenced block."""

    name: str
    shape: Shape

    def core(self) -> RewardCore:
        raise NotImplementedError

    def completion(self, step: Step) -> str:
        raise NotImplementedError

    def tests(self, step: Step) -> Any:
        raise NotImplementedError

    async def _score(self, session: Session, source: Any, steps: list[Step]) -> list[Seen]:
        core = self.core()
        with anyio.fail_after(GUARD_SECONDS):
            scores = await core.score(
                source, session, [self.completion(s) for s in steps], {"tests": [self.tests(s) for s in steps]}
            )
        verdicts = {v.index: v for v in core.last_verdicts}
        out = []
        for i, score in enumerate(scores):
            v = verdicts.get(i)
            out.append(_seen(v) if v is not None else Seen(score, None, "no verdict"))
        return out

    async def fresh(self, session: Session, steps: list[Step]) -> list[Seen]:
        try:
            return await self._score(session, session.sandbox, steps)
        except Exception:  # the batch raised: score each alone, so the raise is charged to its attack
            return await _each(steps, lambda s: self._one_fresh(session, s))

    async def _one_fresh(self, session: Session, step: Step) -> Seen:
        return (await self._score(session, session.sandbox, [step]))[0]

    async def one(self, session: Session, sb: Sandbox, step: Step) -> Seen:
        return (await self._score(session, lambda: _same(sb), [step]))[0]

    async def plant(self, sb: Sandbox, files: dict[str, str]) -> None:
        for path, content in files.items():  # what an earlier completion in this sandbox could leave
            where = path if path.startswith("/") else f"{sb.defaults.working_dir.rstrip('/')}/{path}"
            await sb.write_file(where, content)


class Harness(_RewardMechanism):
    """``code_reward(harness=...)``: assert-style tests under the split or in-process harness."""

    shape: Shape = "function"

    def __init__(self, harness: str, *, python: str = "python3", name: str | None = None) -> None:
        self.name = name or harness
        self.harness, self.python = harness, python

    def core(self) -> RewardCore:
        return RewardCore(
            extractor=None,
            tests_column="tests",
            timeout_seconds=TIMEOUT_SECONDS,
            limit=CONCURRENCY,
            lease_timeout_seconds=60.0,
            python=self.python,
            verbose=False,
            harness=self.harness,
        )

    def completion(self, step: Step) -> str:
        return f"```{step.fence or 'python'}\n{step.code}\n```"

    def tests(self, step: Step) -> Any:
        return step.task.asserts


class Judged(_RewardMechanism):
    """``code_reward(judge=JudgeOptions(...))``: the judge, all-or-nothing (``score="all"``)."""

    def __init__(self, name: str, shape: Shape, language: str, compare: str | Checker = "whitespace") -> None:
        self.name, self.shape, self.language, self.compare = name, shape, language, compare

    def core(self) -> RewardCore:
        return RewardCore(
            extractor=None,
            tests_column="tests",
            timeout_seconds=JUDGE_REWARD_TIMEOUT,
            limit=CONCURRENCY,
            lease_timeout_seconds=JUDGE_REWARD_TIMEOUT,
            python="python3",
            verbose=False,
            judge=JudgeOptions(language=self.language, compare=self.compare, score="all", limits=JUDGE_LIMITS),
        )

    def completion(self, step: Step) -> str:
        return f"```{step.fence or self.language}\n{step.code}\n```"

    def tests(self, step: Step) -> Any:
        return step.task.call_problem() if self.shape == "call" else step.task.stdin_problem()


class Art:
    """ART's ``submit_solution`` tool (``run_tool``), with ``write_file`` for an attack's files."""

    name = "art_submit"
    shape: Shape = "function"

    async def fresh(self, session: Session, steps: list[Step]) -> list[Seen]:
        async def run(step: Step) -> Seen:
            async with session.sandbox() as sb:
                return await self.one(session, sb, step)

        return await _each(steps, run)

    async def one(self, session: Session, sb: Sandbox, step: Step) -> Seen:
        try:
            with anyio.fail_after(GUARD_SECONDS):
                res = await run_tool(
                    sb,
                    ToolCall("submit_solution", {"code": step.code}),
                    tests=step.task.asserts,
                    timeout_seconds=TIMEOUT_SECONDS,
                )
        except Exception as exc:
            return _raised(exc)
        score = None if res.passed is None else (1.0 if res.passed else 0.0)
        if res.verdict is not None:
            return Seen(score, str(res.verdict.kind), res.verdict.reason.strip()[:600])
        return Seen(score, None, res.observation.strip()[:600])

    async def plant(self, sb: Sandbox, files: dict[str, str]) -> None:
        for path, content in files.items():
            res = await run_tool(sb, ToolCall("write_file", {"path": path, "content": content}))
            assert res.ok, f"write_file {path}: {res.observation}"


@dataclass(frozen=True, slots=True)
class Path:
    """A column: ``mechanism`` in ``mode`` ("fresh" or "reused"). ``id``: ``<mechanism>/<mode>``."""

    mechanism: Mechanism
    mode: str

    @property
    def id(self) -> str:
        return f"{self.mechanism.name}/{self.mode}"

    @property
    def shape(self) -> Shape:
        return self.mechanism.shape

    def applies(self, attack: Attack) -> bool:
        return attack.program(self.shape) is not None and self.mode in attack.modes

    def step(self, attack: Attack) -> Step:
        code = attack.program(self.shape)
        assert code is not None
        return Step(code, attack.task, attack.fence)

    async def run(self, session: Session, attacks: list[Attack]) -> list[Outcome]:
        """Every attack's ``Outcome`` on this path (the attacks that apply to its shape)."""
        mech = self.mechanism
        if self.mode == "fresh":
            if any(a.files for a in attacks) and isinstance(mech, Art):
                return await self._each_with_files(session, attacks)
            return [Outcome(s) for s in await mech.fresh(session, [self.step(a) for a in attacks])]
        outcomes: list[Outcome | None] = [None] * len(attacks)
        limiter = anyio.CapacityLimiter(CONCURRENCY)

        async def sequence(i: int) -> None:
            async with limiter:
                try:
                    with anyio.fail_after(GUARD_SECONDS):
                        outcomes[i] = await self._sequence(session, attacks[i])
                except Exception as exc:
                    outcomes[i] = Outcome(_raised(exc))

        async with anyio.create_task_group() as tg:
            for i in range(len(attacks)):
                tg.start_soon(sequence, i)
        return [o if o is not None else Outcome(Seen(None, None, "", raised="no result")) for o in outcomes]

    async def _each_with_files(self, session: Session, attacks: list[Attack]) -> list[Outcome]:
        async def run(attack: Attack) -> Seen:
            async with session.sandbox() as sb:
                await self.mechanism.plant(sb, attack.files)
                return await self.mechanism.one(session, sb, self.step(attack))

        return [Outcome(s) for s in await _each(attacks, run)]

    async def _sequence(self, session: Session, attack: Attack) -> Outcome:
        mech, shape = self.mechanism, self.shape
        neighbour = {label: Step(progs[shape], SUM) for label, progs in (("correct", CORRECT), ("wrong", WRONG))}
        async with session.sandbox() as sb:
            before = await mech.one(session, sb, neighbour["correct"])
            if attack.files:
                await mech.plant(sb, attack.files)
            seen = await mech.one(session, sb, self.step(attack))
            wrong_after = await mech.one(session, sb, neighbour["wrong"])
            correct_after = await mech.one(session, sb, neighbour["correct"])
        return Outcome(
            seen,
            (
                ("the correct completion before it", 1.0, before),
                ("a wrong completion after it", 0.0, wrong_after),
                ("a correct completion after it", 1.0, correct_after),
            ),
        )


MECHANISMS: tuple[Mechanism, ...] = (
    Harness("split"),
    # another interpreter than the warm one: every run is an exec of ``<python> -c`` (other backends' path)
    Harness("split", python="/usr/bin/python3", name="split_exec"),
    Harness("in_process"),
    Judged("judge_python", "stdin", "python"),
    Judged("judge_cpp", "cpp", "cpp"),
    Judged("judge_call", "call", "python"),
    Judged("judge_checker", "stdin", "python", CHECKER),
    Art(),
)
#: Every column of the matrix: each mechanism, fresh and reused.
PATHS: tuple[Path, ...] = tuple(Path(m, mode) for m in MECHANISMS for mode in ("fresh", "reused"))
