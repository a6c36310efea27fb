"""The commands of ``cwsandbox-async`` (doctor, list, sweep, exec, bench) and ``main``.

Every command takes ``--backend local|kubernetes|coreweave`` with its options and ``--json``
for machine-readable output (one JSON document on stdout; errors too). Exit codes
are listed in ``EXIT_CODES`` and in ``cwsandbox-async --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import (
    SandboxBackendUnavailableError,
    SandboxError,
    SandboxTimeoutError,
    SandboxValidationError,
)
from .._types import ExecResult, Resources, SandboxDefaults
from .._validate import validate_path, validate_sweep

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._session import Session

__all__ = ["EXIT_CODES", "main"]

from ._output import emit, exit_status, info_dict, result_doc, table
from ._parser import (
    DEFAULT_TAG,
    EXIT_CODES,
    EXIT_EXEC_ERROR,
    EXIT_EXEC_TIMEOUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SANDBOX,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    PROG,
    ArgumentError,
    UsageError,
    backend_options,
    build_parser,
)


def _session(args: argparse.Namespace, defaults: SandboxDefaults | None = None) -> Any:
    from .._session import Session

    name, options = backend_options(args)
    return Session(defaults or SandboxDefaults(), backend=name, backend_options=options)


async def cmd_list(args: argparse.Namespace) -> int:
    async with _session(args) as s:
        infos = await s.list(args.tag)
    now = time.time()
    rows = [info_dict(i, now) for i in infos]
    emit(args, {"backend": args.backend or "local", "sandboxes": rows}, table(rows))
    return EXIT_OK


async def cmd_sweep(args: argparse.Namespace) -> int:
    validate_sweep(args.tag, args.older_than, needs="--tag and/or --older-than")  # a usage error (exit 2)
    async with _session(args) as s:
        now = time.time()
        matched = [
            i for i in await s.list(args.tag) if args.older_than is None or now - i.created_at >= args.older_than
        ]
        swept: list[str] = []
        if not args.dry_run and matched:
            swept = await s.sweep(args.tag, older_than_seconds=args.older_than)
            left = {i.sandbox_id for i in await s.list(args.tag)} & set(swept)
        else:
            left = set()
    doc = {
        "backend": args.backend or "local",
        "dry_run": args.dry_run,
        "matched": [info_dict(i, now) for i in matched],
        "swept": swept,
        "failed": sorted(left),
    }
    if args.dry_run:
        text = f"would stop {len(matched)} sandbox(es)" + (f":\n{table(doc['matched'])}" if matched else "")
    else:
        text = f"stopped {len(swept) - len(left)} sandbox(es)" + (
            f"; could not stop: {', '.join(sorted(left))}" if left else ""
        )
    emit(args, doc, text)
    return EXIT_FAILED if left else EXIT_OK


async def cmd_exec(args: argparse.Namespace) -> int:
    words = list(args.cmd)
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        raise UsageError("exec needs a command: cwsandbox-async exec [options] -- COMMAND [ARG ...]")
    if args.shell and args.argv:
        raise UsageError("--shell and --argv contradict each other")
    # As Sandbox.exec: a str (one argument) is a shell command line, a list (several) is argv.
    shell = args.shell or (len(words) == 1 and not args.argv)
    command: str | list[str] = " ".join(words) if shell else words
    cwd = None if args.cwd is None else validate_path(args.cwd, "--cwd")  # a usage error (exit 2)
    stdin = await anyio.to_thread.run_sync(sys.stdin.buffer.read) if args.stdin else None
    res: dict[str, Any] = {}
    for key in ("memory_mib", "pids", "cpu"):
        if getattr(args, key) is not None:
            res[key] = getattr(args, key)
    overrides: dict[str, Any] = {
        "tags": (DEFAULT_TAG, *args.tag),
        "network": args.network,
        "create_timeout_seconds": args.create_timeout,
        "env": dict(args.env),
    }
    if res:
        overrides["resources"] = Resources(**res)
    if args.max_output_bytes is not None:
        overrides["max_output_bytes"] = args.max_output_bytes
    defaults = SandboxDefaults().with_overrides(**overrides)
    result: ExecResult | None = None
    error: BaseException | None = None
    async with _session(args, defaults) as s, _sandbox(s, args.sandbox_id) as sb:
        if cwd is not None:
            await _check_directory(sb, cwd)
        try:
            if args.json:
                result = await sb.exec(command, timeout_seconds=args.timeout, stdin=stdin, cwd=cwd)
            else:
                process = sb.process(command, timeout_seconds=args.timeout, stdin=stdin, cwd=cwd)
                async with process as p, anyio.create_task_group() as tg:
                    tg.start_soon(_pump, p.stdout, sys.stdout.buffer)
                    tg.start_soon(_pump, p.stderr, sys.stderr.buffer)
                result = await p.wait()  # outside the block: its error is raised as it is
        except SandboxTimeoutError as exc:
            if exc.infrastructure:
                raise
            error, result = exc, exc.result
    code = EXIT_EXEC_TIMEOUT if error is not None else exit_status(result) if result is not None else EXIT_EXEC_ERROR
    if args.json:
        emit(args, result_doc(result, error, code), "")
    elif error is not None:
        print(f"{PROG}: {error}", file=sys.stderr)
    if result is not None and result.truncated and not args.json:  # --json says "truncated": true
        print(f"{PROG}: {truncation_message(defaults.max_output_bytes)}", file=sys.stderr)
    return code


@contextlib.asynccontextmanager
async def _sandbox(session: Session, sandbox_id: str | None) -> AsyncIterator[Sandbox]:
    """A fresh sandbox, stopped at the end; or the running one ``sandbox_id`` (attached, left running)."""
    if sandbox_id is None:
        async with session.sandbox() as sb:
            yield sb
    else:
        yield await session.attach(sandbox_id)


#: Exits 0 in a directory, non-zero (and says why on stderr) elsewhere, on every backend's /bin/sh.
_CD = 'cd -- "$1"'


async def _check_directory(sb: Sandbox, cwd: str) -> None:
    """``UsageError`` (exit 2) unless ``cwd`` is a directory in the sandbox: a command is never started
    elsewhere, and backends disagree on the code of a start in a missing directory (126 locally, 127 in
    a pod)."""
    probe = await sb.exec(["/bin/sh", "-c", _CD, "sh", cwd], timeout_seconds=30.0)
    if probe.returncode != 0:
        said = probe.stderr.strip().splitlines()[-1:] or [f"exit {probe.returncode}"]
        raise UsageError(f"--cwd {cwd}: not a directory in the sandbox ({said[0]})")


def truncation_message(cap: int) -> str:
    """What the CLI says when a command's output passed the cap (``--max-output-bytes``)."""
    size = f"{cap / 2**20:g} MiB" if cap % 2**10 == 0 and cap >= 2**20 else f"{cap} bytes"
    return f"output truncated at {size} (--max-output-bytes); the command was killed"


async def _pump(stream: Any, out: Any) -> None:
    """Copy output chunks to our own stdout/stderr as they arrive (a CLI's loop has nothing else to serve)."""
    async for chunk in stream:
        out.write(chunk)
        out.flush()


async def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import render, run_doctor

    name, options = backend_options(args)
    report = await run_doctor(name, options, skip=("kubernetes",) if args.skip_kubernetes else ())
    emit(args, report.as_dict(), render(report))
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_bench(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parent.parent.parent
    if not (root / "benchmarks" / "__main__.py").is_file():
        raise UsageError(f"the benchmarks ship with the source repository; none found next to the package ({root})")
    argv = [sys.executable, "-m", "benchmarks", *(["--quick"] if args.quick else [])]
    if args.only:
        argv += ["--only", args.only]
    return subprocess.run(argv, cwd=root, check=False).returncode


COMMANDS = {"list": cmd_list, "sweep": cmd_sweep, "exec": cmd_exec, "doctor": cmd_doctor}


def _fail(args: argparse.Namespace | None, exc: BaseException, code: int) -> int:
    message = str(exc) or type(exc).__name__
    print(f"{PROG}: {message}", file=sys.stderr)
    if isinstance(exc, ArgumentError):
        print(f"{PROG}: see '{exc.usage_of} --help'", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"exit_code": code, "error": {"type": type(exc).__name__, "message": message}}))
    return code


def exit_code(exc: SandboxError, command: str) -> int:
    """The exit code of a command that failed with ``exc`` (see ``EXIT_CODES``)."""
    if isinstance(exc, SandboxValidationError):
        return EXIT_USAGE
    if isinstance(exc, SandboxBackendUnavailableError):  # exec's too: unusable or unreachable, whenever
        return EXIT_UNAVAILABLE
    return EXIT_EXEC_ERROR if command == "exec" else EXIT_SANDBOX


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see ``EXIT_CODES``).

    A bad argument is one line on stderr (and where to find ``--help``), exit 2; ``--help`` and
    ``--version`` print and raise ``SystemExit(0)``, as argparse does."""
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        if args.command == "bench":
            return cmd_bench(args)
        return anyio.run(COMMANDS[args.command], args, backend="asyncio")
    except UsageError as exc:
        if args is None:  # argparse's: --json is honoured for its error too, as for every other
            words = list(sys.argv[1:] if argv is None else argv)
            args = argparse.Namespace(json="--json" in words[: words.index("--") if "--" in words else None])
        return _fail(args, exc, EXIT_USAGE)
    except SandboxError as exc:
        assert args is not None  # nothing before the parse raises one
        return _fail(args, exc, exit_code(exc, args.command))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
