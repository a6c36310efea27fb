"""What the command line prints: tables, JSON documents, exec results."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
from typing import Any

from .._types import ExecResult, SandboxInfo

__all__ = ["emit", "exit_status", "info_dict", "result_doc", "result_fields", "table"]


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


def exit_status(result: ExecResult) -> int:
    return 128 + -result.returncode if result.returncode < 0 else result.returncode & 0xFF


def _bytes_doc(prefix: str, data: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = {prefix: data.decode("utf-8", "replace")}
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        doc[f"{prefix}_base64"] = base64.b64encode(data).decode()
    return doc


def result_fields(result: ExecResult) -> dict[str, Any]:
    """Every field of ``result`` (so a fact added to ``ExecResult`` is in ``--json`` too) and its ``signal``:
    ``stdout_bytes``/``stderr_bytes`` as ``stdout``/``stderr`` (text, plus ``*_base64`` when not UTF-8),
    seconds rounded to 0.1 ms."""
    doc: dict[str, Any] = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, bytes):
            doc.update(_bytes_doc(f.name.removesuffix("_bytes"), value))
        elif isinstance(value, float):
            doc[f.name] = round(value, 4)
        elif isinstance(value, tuple):
            doc[f.name] = list(value)
        else:
            doc[f.name] = value
    doc["signal"] = result.signal
    return doc


def result_doc(result: ExecResult | None, error: BaseException | None, code: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"exit_code": code, "error": None}
    if result is not None:
        doc.update(result_fields(result))
    if error is not None:
        doc["error"] = {"type": type(error).__name__, "message": str(error)}
    return doc
