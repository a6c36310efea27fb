"""The driver's side of the in-sandbox runner (``sandboxed/runner.py``): build a job, run it in one exec, read it back.

One exec per completion does everything in the sandbox: write the source, compile it, run every
case in a fresh process with its own limits, and report each case as one JSON line. How the exec
itself ended decides what happened to the cases it did not report (``Ended``): the program took
the runner down (its failure), the exec ran out of time (the program's, or the platform's when
starved), or the platform failed.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from .._errors import SandboxError, SandboxTerminatedError, SandboxTimeoutError, SandboxValidationError
from .._log import log
from ._types import JudgeError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .._sandbox import Sandbox
    from .._types import ExecResult

__all__ = ["RUNNER_SOURCE", "SWEEP_SLACK_SECONDS", "Ended", "JobReport", "RawCase", "Step", "run_job"]

_SANDBOXED = resources.files(__package__).joinpath("sandboxed")
#: The runner as one script: the sweep's functions, then the runner (``sandboxed/``).
RUNNER_SOURCE = (
    _SANDBOXED.joinpath("sweep.py").read_text("utf-8") + "\n\n" + _SANDBOXED.joinpath("runner.py").read_text("utf-8")
)
HARNESS_SOURCE = resources.files(__package__).joinpath("sandboxed", "call_harness.py").read_text("utf-8")
#: The starvation thresholds (as ``SandboxDefaults.starved_*``): a case killed at its wall limit that
#: used less than this share of the wall time as CPU ...
STARVED_CPU_SHARE = 0.5
#: ... and whose processes waited at least this share of it in the run queue is re-run, not failed.
STARVED_WAIT_SHARE = 0.25
#: Time the runner needs around its cases (its start, reading the job, reports).
RUNNER_SLACK_SECONDS = 5.0
#: Time the sweep gets beyond the cases' CPU limits (a program makes files no faster than they go).
SWEEP_SLACK_SECONDS = 5.0
#: The follow-up sweep's exec timeout (a program killed the runner before its own sweep).
FOLLOW_UP_SWEEP_SECONDS = 60.0
#: Entries of the writable places the runner records one by one; past it, it sweeps by time.
SNAPSHOT_LIMIT = 200_000
_REPORT_OVERHEAD = 512


@dataclass(frozen=True, slots=True)
class Step:
    """How to run one process: argv, environment and limits (the runner's per-case settings)."""

    argv: Sequence[str]
    cwd: str
    env: Mapping[str, str]
    time_seconds: float
    wall_seconds: float
    memory_bytes: int | None
    output_bytes: int
    stderr_bytes: int
    sample_seconds: float = 0.005
    file_size_bytes: int = 256 * 1024 * 1024

    def as_job(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "env": dict(self.env),
            "time": self.time_seconds,
            "wall": self.wall_seconds,
            "memory": self.memory_bytes,
            "output": self.output_bytes,
            "stderr": self.stderr_bytes,
            "sample": self.sample_seconds,
            "rlimits": {"cpu": math.ceil(self.time_seconds) + 1, "fsize": self.file_size_bytes, "core": 0},
        }


@dataclass(frozen=True, slots=True)
class RawCase:
    """One process as the runner saw it (``index`` -1 is the compile step)."""

    index: int
    exit_code: int
    cpu_seconds: float
    wall_seconds: float
    memory_bytes: int
    killed: str | None
    wait_seconds: float
    cgroup_oom: bool
    stdout: bytes
    stderr: bytes


class Ended:
    """How the runner's exec ended, for the cases it did not report."""

    COMPLETE = "complete"  # every case it was asked to run was reported
    RUNNER_KILLED = "runner_killed"  # the program killed the runner (or its memory did)
    TIMED_OUT = "timed_out"  # the exec's own timeout: the program held the runner up
    STARVED = "starved"  # the exec's timeout fired while it was starved of CPU: the platform's
    INFRASTRUCTURE = "infrastructure"  # the platform failed (sandbox died for outside reasons, transport)


@dataclass(frozen=True, slots=True)
class JobReport:
    """What the runner reported. ``clean``: nothing of the job is left in the sandbox (the runner's
    sweep, or the follow-up's, finished without an error); ``None`` when no sweep was asked."""

    compile: RawCase | None
    cases: list[RawCase]
    ended: str
    detail: str = ""
    oom_killed: bool = False
    clean: bool | None = None
    t0: int | None = None


def _raw(line: dict[str, Any]) -> RawCase:
    return RawCase(
        index=int(line["i"]),
        exit_code=int(line["exit"]),
        cpu_seconds=float(line["cpu"]),
        wall_seconds=float(line["wall"]),
        memory_bytes=int(line["rss"]),
        killed=line["killed"],
        wait_seconds=float(line["wait"]),
        cgroup_oom=bool(line["oom"]),
        stdout=base64.b64decode(line["out"]),
        stderr=base64.b64decode(line["err"]),
    )


@dataclass(slots=True)
class _Parsed:
    compiled: RawCase | None = None
    cases: list[RawCase] = field(default_factory=list)
    done: bool = False
    clean: bool | None = None
    t0: int | None = None


def _parse(stdout: bytes) -> _Parsed:
    """The runner's report lines (its stdout, a stream only the runner writes to)."""
    out = _Parsed()
    for text in stdout.split(b"\n"):
        if not text:
            continue
        try:
            line = json.loads(text)
        except ValueError:
            break  # a torn last line: the runner died while writing it
        if line.get("done"):
            out.done = True
            break
        if "t0" in line:
            out.t0 = line["t0"]
        elif "clean" in line:
            out.clean = bool(line["clean"])
        else:
            raw = _raw(line)
            if raw.index < 0:
                out.compiled = raw
            else:
                out.cases.append(raw)
    return out


async def run_job(
    sandbox: Sandbox,
    *,
    step: Step,
    inputs: Sequence[Sequence[bytes]],
    compile_step: Step | None = None,
    mkdirs: Sequence[str] = (),
    write: Mapping[str, bytes] | None = None,
    files: Sequence[str] = (),
    stop_on_failure: bool = False,
    exec_timeout_seconds: float | None = None,
    remove: Sequence[str] | None = None,
    priority_cpu_seconds: float | None = None,
) -> JobReport:
    """Run ``inputs`` (per case: stdin, then the contents of ``files``) under ``step``, in one exclusive exec.

    ``write`` files are written (and ``mkdirs`` made) first, then ``compile_step`` runs. With
    ``remove`` (the job's own directories), the runner sweeps after the last case: those
    directories and everything the program created or changed go (``sandboxed/sweep.py``); if the
    exec ended before its sweep, a follow-up exec sweeps by time. Raises ``JudgeError`` if the
    runner could not start, and the exec's errors that are neither the program's nor the
    platform's (a stopped sandbox, bad input, bugs); everything else is in the report's ``ended``.

    ``priority_cpu_seconds``: run the exec with CPU priority over the other sandboxes (where the backend
    can: ``Sandbox.exec(cpu_priority=True)``) within that CPU budget, for a re-run of what was starved;
    an exec that uses it all ended by the program's doing (``Ended.TIMED_OUT``).
    """
    writes = dict(write or {})
    job = step.as_job()
    job.update(
        sizes=[[len(p) for p in parts] for parts in inputs],
        files=list(files),
        stop_on_failure=stop_on_failure,
        starved=[STARVED_CPU_SHARE, STARVED_WAIT_SHARE],
        mkdirs=list(mkdirs),
        write=list(writes),
        compile=compile_step.as_job() if compile_step is not None else None,
        clean={"remove": list(remove), "limit": SNAPSHOT_LIMIT} if remove is not None else None,
    )
    if writes:
        job["sizes"].insert(0, [len(v) for v in writes.values()])
    payload = [json.dumps(job).encode() + b"\n", *writes.values()]
    for parts in inputs:
        payload.extend(parts)
    per_case = (step.output_bytes + step.stderr_bytes) * 4 // 3 + _REPORT_OVERHEAD
    cap = per_case * (len(inputs) + 1) + 4096
    if exec_timeout_seconds is None:
        exec_timeout_seconds = job_seconds(step, len(inputs), compile_step, sweep=remove is not None)
    report = await _exec(sandbox, b"".join(payload), exec_timeout_seconds, cap, remove, priority_cpu_seconds)
    if remove is not None and report.clean is not True:
        clean = await sweep_after(sandbox, report.t0, remove)
        report = dataclasses.replace(report, clean=clean)
    return report


def job_seconds(step: Step, cases: int, compile_step: Step | None, *, sweep: bool) -> float:
    """The exec timeout of a job: its compile, every case's wall limit and overhead, its sweep, slack."""
    total = RUNNER_SLACK_SECONDS + cases * (step.wall_seconds + 0.5)
    if compile_step is not None:
        total += compile_step.wall_seconds
    if sweep:
        total += SWEEP_SLACK_SECONDS + cases * step.time_seconds
    return total


async def _exec(
    sandbox: Sandbox, stdin: bytes, seconds: float, cap: int, remove: Sequence[str] | None, cpu: float | None
) -> JobReport:
    try:
        result = await sandbox.run_python(
            RUNNER_SOURCE,
            stdin=stdin,
            timeout_seconds=seconds,
            cwd="/",
            max_output_bytes=cap,
            exclusive=True,
            cpu_seconds=cpu,
            cpu_priority=cpu is not None,
        )
    except SandboxTimeoutError as exc:
        parsed = _parse(exc.result.stdout_bytes if exc.result is not None else b"")
        ended = Ended.STARVED if exc.infrastructure else Ended.TIMED_OUT
        return JobReport(parsed.compiled, parsed.cases, ended, detail=exc.message, clean=parsed.clean, t0=parsed.t0)
    except (SandboxTerminatedError, SandboxValidationError):
        raise  # the caller stopped the sandbox, or gave bad input
    except SandboxError as exc:
        # A dead sandbox or broken channel: the program's doing unless the error says it was the platform.
        ended = Ended.INFRASTRUCTURE if exc.infrastructure else Ended.RUNNER_KILLED
        return JobReport(None, [], ended, detail=exc.message)
    if cpu is not None and result.cpu_exceeded:  # a prioritised re-run used its whole CPU budget: the program did
        parsed = _parse(result.stdout_bytes)
        detail = f"it used the re-run's CPU budget ({cpu:g} s) with CPU priority"
        ended = Ended.TIMED_OUT
        return JobReport(parsed.compiled, parsed.cases, ended, detail=detail, clean=parsed.clean, t0=parsed.t0)
    try:
        return _report(result)
    except JudgeError:
        if remove is not None:
            await sweep_after(sandbox, None, remove)
        raise


async def sweep_after(sandbox: Sandbox, t0: int | None, remove: Sequence[str]) -> bool:
    """The follow-up sweep (``remove``, and by time since ``t0`` when known): whether it left the sandbox clean.

    Never raises for what the sandbox did: a sandbox that cannot be swept is not clean."""
    job = {"sizes": [], "sweep_only": True, "clean": {"remove": list(remove), "t0": t0}}
    try:
        result = await sandbox.run_python(
            RUNNER_SOURCE,
            stdin=json.dumps(job).encode() + b"\n",
            timeout_seconds=FOLLOW_UP_SWEEP_SECONDS,
            cwd="/",
            max_output_bytes=4096,
            exclusive=True,
        )
    except SandboxError as exc:
        log.warning("the judge's follow-up sweep failed", error=exc.message, sandbox_id=sandbox.sandbox_id)
        return False
    clean = _parse(result.stdout_bytes).clean is True
    if not clean:
        log.warning("the judge's follow-up sweep left the sandbox unclean", stderr=result.stderr[-500:])
    return clean


def _report(result: ExecResult) -> JobReport:
    p = _parse(result.stdout_bytes)
    if p.done:
        return JobReport(p.compiled, p.cases, Ended.COMPLETE, oom_killed=result.oom_killed, clean=p.clean, t0=p.t0)
    if result.returncode in (3, 4) and b"runner: " in result.stderr_bytes:
        if p.compiled is None and not p.cases:
            raise JudgeError(f"the judge's runner failed in the sandbox: {result.stderr.strip()[-2000:]}")
        log.error("the judge's runner failed after a case ran", stderr=result.stderr[-2000:])
    detail = f"the runner ended early (exit {result.returncode}): {result.stderr.strip()[-300:]}"
    return JobReport(
        p.compiled, p.cases, Ended.RUNNER_KILLED, detail=detail, oom_killed=result.oom_killed, clean=p.clean, t0=p.t0
    )
