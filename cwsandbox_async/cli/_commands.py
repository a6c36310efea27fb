"""``cwsandbox-async``: the operator's command line (doctor, list, sweep, exec, bench).

Every command takes ``--backend local|kubernetes`` with its options and ``--json``
for machine-readable output (one JSON document on stdout; errors too). Exit codes
are listed in ``EXIT_CODES`` and in ``cwsandbox-async --help``.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from ._errors import (
    SandboxBackendUnavailableError,
    SandboxError,
    SandboxTimeoutError,
    SandboxValidationError,
)
from ._types import ExecResult, Resources, SandboxDefaults, SandboxInfo

__all__ = ["EXIT_CODES", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_SANDBOX = 4
EXIT_EXEC_TIMEOUT = 124
EXIT_EXEC_ERROR = 125
EXIT_INTERRUPTED = 130

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "doctor: a protection did not hold; sweep: a sandbox could not be stopped",
    EXIT_USAGE: "bad arguments or options",
    EXIT_UNAVAILABLE: "the backend cannot be used here (no bwrap/unshare; no Kubernetes config; API unreachable)",
    EXIT_SANDBOX: "a sandbox operation failed (create, transport, ...)",
    EXIT_EXEC_TIMEOUT: "exec: the command hit --timeout (its process tree was killed)",
    EXIT_EXEC_ERROR: "exec: the command could not be run (the reason is on stderr, or in --json's 'error')",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); sandboxes were stopped",
}
EPILOG = (
    "exit codes:\n"
    + "\n".join(f"  {code:<4} {what}" for code, what in EXIT_CODES.items())
    + "\n  exec otherwise exits with the command's own exit status (128+N if signal N killed it);"
    "\n  a usage error (2) is found before the command runs.\n\n"
    "examples:\n"
    "  cwsandbox-async doctor\n"
    "  cwsandbox-async exec -- python3 -c 'print(2 + 2)'\n"
    "  cwsandbox-async list --tag run:abc --json\n"
    "  cwsandbox-async sweep --tag run:abc --older-than 2h\n"
    "  cwsandbox-async --backend kubernetes --namespace rl list\n"
    "  cwsandbox-async bench --quick --only exec"
)
DEFAULT_TAG = "cwsandbox-cli"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class UsageError(Exception):
    """Bad command line input found after argparse (exit 2)."""


# -- argument parsing -------------------------------------------------------------------------------


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 90s, 15m, 2h, 1d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _common(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    """Options every command accepts (before or after the command name)."""
    default = argparse.SUPPRESS if sub else None
    g = parser.add_argument_group("backend")
    g.add_argument(
        "--backend", choices=("local", "kubernetes"), default=default, help="where sandboxes run (default: local)"
    )
    g.add_argument(
        "--backend-option",
        action="append",
        type=key_value,
        default=default,
        metavar="KEY=VALUE",
        help="any backend constructor option (value parsed as JSON when it can be); repeatable",
    )
    g.add_argument(
        "--isolation", choices=("auto", "bwrap", "unshare", "none"), default=default, help="local: isolation level"
    )
    g.add_argument("--state-dir", default=default, help="local: the registry directory (list/sweep look there)")
    g.add_argument("--kubeconfig", default=default, help="kubernetes: kubeconfig file")
    g.add_argument("--context", default=default, help="kubernetes: kubeconfig context")
    g.add_argument("--namespace", default=default, help="kubernetes: namespace")
    g.add_argument("--server", default=default, help="kubernetes: API server URL (instead of a kubeconfig)")
    g.add_argument("--image", default=default, help="kubernetes: container image")
    parser.add_argument("--json", action="store_true", default=default, help="print one JSON document on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cwsandbox-async",
        description="Operate cwsandbox_async sandboxes: check isolation, find and sweep leftovers, run a command.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(parser, sub=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _common(p, sub=True)
        return p

    p = add("doctor", "report what isolation this machine gives; every claim is backed by a probe it runs")
    p.add_argument("--skip-kubernetes", action="store_true", help="do not look for a Kubernetes configuration")

    p = add("list", "list sandboxes (including leftovers of crashed drivers), filtered by tags")
    p.add_argument(
        "--tag", action="append", default=[], help="only sandboxes carrying this tag; repeatable (all must match)"
    )

    p = add("sweep", "stop leftover sandboxes by tag and/or age")
    p.add_argument("--tag", action="append", default=[], help="only sandboxes carrying this tag; repeatable")
    p.add_argument(
        "--older-than", type=duration, metavar="DURATION", help="only sandboxes older than this (90s, 15m, 2h, 1d)"
    )
    p.add_argument("--dry-run", action="store_true", help="show what would be stopped, stop nothing")

    p = add("exec", "run one command in a fresh sandbox, print its output, exit with its exit status")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before the command is killed (default 60)")
    p.add_argument("--cwd", help="working directory inside the sandbox")
    p.add_argument("--env", action="append", type=key_value, default=[], metavar="KEY=VALUE", help="repeatable")
    p.add_argument("--stdin", action="store_true", help="pass this program's stdin to the command")
    p.add_argument("--shell", action="store_true", help="run the words as one /bin/sh -c script")
    p.add_argument("--tag", action="append", default=[], help=f"tag the sandbox (besides {DEFAULT_TAG}); repeatable")
    p.add_argument("--network", action="store_true", help="give the sandbox network access")
    p.add_argument("--memory-mib", type=int, help="memory limit")
    p.add_argument("--pids", type=int, help="process limit")
    p.add_argument("--cpu", type=float, help="CPU limit (cores)")
    p.add_argument("--max-output-bytes", type=int, help="cap per stream (default 16 MiB)")
    p.add_argument("--create-timeout", type=float, default=120.0, help="seconds to wait for the sandbox to start")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]", help="the command to run")

    p = add("bench", "run the benchmark harness (python -m benchmarks; needs a source checkout)")
    p.add_argument("--quick", action="store_true", help="short runs")
    p.add_argument("--only", default="", help="comma-separated subset of the benchmarks")
    return parser


def backend_options(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    name = args.backend or "local"
    options: dict[str, Any] = {}
    local_only = {"isolation": args.isolation, "state_dir": args.state_dir}
    k8s_only = {
        "kubeconfig": args.kubeconfig,
        "context": args.context,
        "namespace": args.namespace,
        "server": args.server,
        "image": args.image,
    }
    mine, other = (local_only, k8s_only) if name == "local" else (k8s_only, local_only)
    wrong = [k.replace("_", "-") for k, v in other.items() if v is not None]
    if wrong:
        other_name = "kubernetes" if name == "local" else "local"
        raise UsageError(f"--{', --'.join(wrong)}: only for --backend {other_name}")
    options.update({k: v for k, v in mine.items() if v is not None})
    for key, raw in args.backend_option or []:
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return name, options


# -- output -------------------------------------------------------------------------------------------


def emit(args: argparse.Namespace, doc: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    elif text:
        print(text)


def info_dict(info: SandboxInfo, now: float) -> dict[str, Any]:
    return {
        "sandbox_id": info.sandbox_id,
        "status": info.status.value,
        "tags": list(info.tags),
        "created_at": info.created_at,
        "age_seconds": round(max(0.0, now - info.created_at), 1),
        "session_id": info.session_id,
        "owner_pid": info.owner_pid,
        "owner_alive": info.owner_alive,
        "backend": info.backend,
    }


def human_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no sandboxes"
    lines = [("SANDBOX", "STATUS", "AGE", "OWNER", "TAGS")]
    for r in rows:
        owner = "-" if r["owner_pid"] is None else f"{r['owner_pid']} ({'alive' if r['owner_alive'] else 'gone'})"
        lines.append((r["sandbox_id"], r["status"], human_age(r["age_seconds"]), owner, ",".join(r["tags"])))
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line[:4], widths, strict=True)) + "  " + line[4] for line in lines
    )


# -- commands -----------------------------------------------------------------------------------------


def _session(args: argparse.Namespace, defaults: SandboxDefaults | None = None) -> Any:
    from ._session import Session

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
    if not args.tag and args.older_than is None:
        raise UsageError("sweep needs --tag and/or --older-than, so it cannot stop everything by accident")
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


def exit_status(result: ExecResult) -> int:
    return 128 + -result.returncode if result.returncode < 0 else result.returncode & 0xFF


def _bytes_doc(prefix: str, data: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = {prefix: data.decode("utf-8", "replace")}
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        doc[f"{prefix}_base64"] = base64.b64encode(data).decode()
    return doc


def result_doc(result: ExecResult | None, error: BaseException | None, code: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"exit_code": code, "error": None}
    if result is not None:
        doc.update(
            returncode=result.returncode,
            timed_out=result.timed_out,
            truncated=result.truncated,
            wall_seconds=round(result.wall_seconds, 4),
            cpu_seconds=round(result.cpu_seconds, 4),
            sandbox_id=result.sandbox_id,
            **_bytes_doc("stdout", result.stdout_bytes),
            **_bytes_doc("stderr", result.stderr_bytes),
        )
    if error is not None:
        doc["error"] = {"type": type(error).__name__, "message": str(error)}
    return doc


async def cmd_exec(args: argparse.Namespace) -> int:
    words = list(args.cmd)
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        raise UsageError("exec needs a command: cwsandbox-async exec [options] -- COMMAND [ARG ...]")
    command: str | list[str] = " ".join(words) if args.shell else words
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
    if args.cwd is not None:
        overrides["working_dir"] = args.cwd
    defaults = SandboxDefaults().with_overrides(**overrides)
    result: ExecResult | None = None
    error: BaseException | None = None
    async with _session(args, defaults) as s, s.sandbox() as sb:
        try:
            if args.json:
                result = await sb.exec(command, timeout_seconds=args.timeout, stdin=stdin)
            else:
                process = sb.process(command, timeout_seconds=args.timeout, stdin=stdin)
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
        print(f"cwsandbox-async: {error}", file=sys.stderr)
    return code


async def _pump(stream: Any, out: Any) -> None:
    """Copy output chunks to our own stdout/stderr as they arrive (a CLI's loop has nothing else to serve)."""
    async for chunk in stream:
        out.write(chunk)
        out.flush()


async def cmd_doctor(args: argparse.Namespace) -> int:
    from ._doctor import run_doctor

    name, options = backend_options(args)
    explicit_k8s = args.backend == "kubernetes"
    report = await run_doctor(
        local=name == "local",
        kubernetes=False if args.skip_kubernetes else (True if explicit_k8s else None),
        local_options=options if name == "local" else {},
        k8s_options=options if name == "kubernetes" else {},
    )
    lines = []
    for section in report.sections:
        lines.append(f"{section.name} backend")
        for c in section.checks:
            lines.append(f"  {c.status:<5} {c.name:<24} {c.detail}")
            if c.probe:
                lines.append(f"  {'':<5} {'':<24} probe: {c.probe}")
        if section.facts.get("limits_enforced_by"):
            enforced = ", ".join(f"{k}: {v}" for k, v in sorted(section.facts["limits_enforced_by"].items()))
            lines.append(f"  limits enforced by: {enforced}")
    failed = sum(c.status == "fail" for s in report.sections for c in s.checks)
    lines.append("all protections hold" if report.ok else f"{failed} check(s) failed")
    emit(args, report.as_dict(), "\n".join(lines))
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_bench(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__main__.py").is_file():
        raise UsageError(f"the benchmarks ship with the source repository; none found next to the package ({root})")
    argv = [sys.executable, "-m", "benchmarks", *(["--quick"] if args.quick else [])]
    if args.only:
        argv += ["--only", args.only]
    return subprocess.run(argv, cwd=root, check=False).returncode


COMMANDS = {"list": cmd_list, "sweep": cmd_sweep, "exec": cmd_exec, "doctor": cmd_doctor}


def _fail(args: argparse.Namespace, exc: BaseException, code: int) -> int:
    message = str(exc) or type(exc).__name__
    print(f"cwsandbox-async: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"exit_code": code, "error": {"type": type(exc).__name__, "message": message}}))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see ``EXIT_CODES``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    is_exec = args.command == "exec"
    try:
        if args.command == "bench":
            return cmd_bench(args)
        return anyio.run(COMMANDS[args.command], args, backend="asyncio")
    except UsageError as exc:
        return _fail(args, exc, EXIT_USAGE)
    except SandboxValidationError as exc:
        return _fail(args, exc, EXIT_USAGE)
    except SandboxBackendUnavailableError as exc:
        return _fail(args, exc, EXIT_EXEC_ERROR if is_exec else EXIT_UNAVAILABLE)
    except SandboxError as exc:
        return _fail(args, exc, EXIT_EXEC_ERROR if is_exec else EXIT_SANDBOX)
    except KeyboardInterrupt:
        print("cwsandbox-async: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
