"""The command line's arguments: the parser, durations, exit codes, and per-backend options."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, NoReturn

from .. import __version__
from ..backends import BACKENDS

__all__ = [
    "CHOICES",
    "DEFAULT_TAG",
    "EXIT_CODES",
    "PROG",
    "ArgumentError",
    "UsageError",
    "backend_options",
    "build_parser",
    "duration",
]

#: The console script's name: the prefix of every line the command line itself writes on stderr.
PROG = "cwsandbox-async"

#: The backends the command line offers (every registered one but the in-memory fake).
CHOICES = tuple(name for name in BACKENDS if name != "fake")
#: The flags that belong to one backend (each becomes that backend's constructor option of the same name).
BACKEND_FLAGS: dict[str, tuple[str, ...]] = {
    "local": ("isolation", "state_dir"),
    "kubernetes": ("kubeconfig", "context", "namespace", "server", "image"),
    "coreweave": ("base_url",),
}

#: Exit codes (also listed by ``--help``).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_SANDBOX = 4
EXIT_EXEC_TIMEOUT = 124
EXIT_EXEC_ERROR = 125
EXIT_NOT_EXECUTABLE = 126  # from the sandbox, as sh reports it (Sandbox.exec returns it as the returncode)
EXIT_NOT_FOUND = 127  # same
EXIT_INTERRUPTED = 130

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "doctor: a protection did not hold; sweep: a sandbox could not be stopped",
    EXIT_USAGE: "bad arguments or options (exec: also a --cwd that is not a directory in the sandbox)",
    EXIT_UNAVAILABLE: "the backend cannot be used here (no bwrap/unshare; no Kubernetes config; API unreachable)",
    EXIT_SANDBOX: "a sandbox operation failed (create, transport, ...)",
    EXIT_EXEC_TIMEOUT: "exec: the command hit --timeout (its process tree was killed)",
    EXIT_EXEC_ERROR: "exec: the sandbox failed before or while running the command (reason on stderr / in 'error')",
    EXIT_NOT_EXECUTABLE: "exec: the command was found but could not be started (as sh, and Sandbox.exec's returncode)",
    EXIT_NOT_FOUND: "exec: the command was not found (as sh, and Sandbox.exec's returncode)",
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
    "  cwsandbox-async exec 'echo hi | tr a-z A-Z'      # one argument: a shell command line\n"
    "  cwsandbox-async exec --id sbx-0123abcd4567 -- ls  # in a running sandbox (see list)\n"
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


class ArgumentError(UsageError):
    """What argparse found wrong; ``usage_of`` names the (sub)command whose ``--help`` to suggest."""

    def __init__(self, message: str, usage_of: str) -> None:
        super().__init__(message)
        self.usage_of = usage_of


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument raises ``ArgumentError`` (one line, and a hint to ``--help``, from
    ``main``) instead of printing the whole usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentError(message, self.prog)


# -- argument parsing -------------------------------------------------------------------------------


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 90s, 15m, 2h, 1d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse names the flag in its error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def positive_int(text: str) -> int:
    """A positive int (argparse names the flag in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def cores(text: str) -> float:
    """A positive number of CPU cores."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of cores: {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number of cores, got {text}")
    return value


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _common(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    """Options every command accepts (before or after the command name)."""
    default = argparse.SUPPRESS if sub else None
    g = parser.add_argument_group("backend")
    g.add_argument("--backend", choices=CHOICES, default=default, help="where sandboxes run (default: local)")
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
    g.add_argument("--base-url", default=default, help="coreweave: service URL (default $CWSANDBOX_BASE_URL)")
    parser.add_argument("--json", action="store_true", default=default, help="print one JSON document on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Operate cwsandbox_async sandboxes: check isolation, find and sweep leftovers, run a command.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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

    p = add(
        "exec",
        "run one command in a fresh sandbox, print its output, exit with its exit status; "
        "like Sandbox.exec, one argument is a shell command line (/bin/sh -c), several are argv",
    )
    p.add_argument("--timeout", type=seconds, default=60.0, help="seconds before the command is killed (default 60)")
    p.add_argument(
        "--id",
        dest="sandbox_id",
        metavar="SANDBOX_ID",
        help="run in this running sandbox (Session.attach: another process's, of this user) instead of a fresh "
        "one; it is left running (exit 125 if there is no such sandbox)",
    )
    p.add_argument("--cwd", help="the command's working directory inside the sandbox (must exist; exit 2 if not)")
    p.add_argument("--env", action="append", type=key_value, default=[], metavar="KEY=VALUE", help="repeatable")
    p.add_argument("--stdin", action="store_true", help="pass this program's stdin to the command")
    p.add_argument(
        "--shell",
        action="store_true",
        help="run the words, joined by spaces, as one /bin/sh -c script (one word always is one)",
    )
    p.add_argument(
        "--argv", action="store_true", help="run a single word as a program name, not as a shell command line"
    )
    p.add_argument("--tag", action="append", default=[], help=f"tag the sandbox (besides {DEFAULT_TAG}); repeatable")
    p.add_argument("--network", action="store_true", help="give the sandbox network access")
    p.add_argument("--memory-mib", type=positive_int, help="memory limit")
    p.add_argument("--pids", type=positive_int, help="process limit")
    p.add_argument("--cpu", type=cores, help="CPU limit (cores)")
    p.add_argument("--max-output-bytes", type=positive_int, help="cap per stream (default 16 MiB)")
    p.add_argument("--create-timeout", type=seconds, default=120.0, help="seconds to wait for the sandbox to start")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]", help="the command to run")

    p = add("bench", "run the benchmark harness (python -m benchmarks; needs a source checkout)")
    p.add_argument("--quick", action="store_true", help="short runs")
    p.add_argument("--only", default="", help="comma-separated subset of the benchmarks")
    return parser


def backend_options(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The backend's name and constructor options; ``UsageError`` for another backend's flag."""
    name = args.backend or "local"
    for other, flags in BACKEND_FLAGS.items():
        wrong = [f"--{f.replace('_', '-')}" for f in flags if other != name and getattr(args, f, None) is not None]
        if wrong:
            raise UsageError(f"{', '.join(wrong)}: only for --backend {other}")
    options: dict[str, Any] = {
        flag: getattr(args, flag) for flag in BACKEND_FLAGS.get(name, ()) if getattr(args, flag, None) is not None
    }
    for key, raw in args.backend_option or []:
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return name, options
