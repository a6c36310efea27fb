"""Read the records back from an offline W&B run's ``.wandb`` transaction log.

The file is a 7-byte header (``b":W&B"``, 0xBEE1, version 0) followed by LevelDB-log
chunks in 32 KiB blocks (``<IHB`` crc32, length, type 1 full / 2 first / 3 middle /
4 last; the crc is zlib's crc32 of the type byte and the data). Each payload is a
``wandb_internal_pb2.Record``; history rows live in ``record.history.item``.

``wandb-core`` writes the log from its own process and may still be writing it
when ``run.finish()`` returns under load: a reader that parses a half-written
record gets garbage (``DecodeError: Wire format was corrupt``). So every chunk's
crc is checked, a torn tail is never parsed, and ``records`` waits (up to
``timeout`` seconds) until the log holds the run's ``exit`` record.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from pathlib import Path
from typing import Any

from guards import HANG_GUARD_SECONDS
from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32 * 1024
HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class TornLog(Exception):
    """The log ends in the middle of a record (still being written, or cut short)."""


def _payloads(data: bytes) -> list[bytes]:
    """Every complete record payload; raises ``TornLog`` at a partial or corrupt chunk."""
    if len(data) < 7:
        raise TornLog("no header yet")
    magic, ident, version = struct.unpack_from("<4sHB", data)
    assert (magic, ident, version) == (b":W&B", 0xBEE1, 0), "not a W&B transaction log"
    out: list[bytes] = []
    pos, pending = 7, b""
    while pos < len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER.size:  # the block's tail is padding
            pos += room
            continue
        if pos + HEADER.size > len(data):
            raise TornLog(f"chunk header cut at byte {pos}")
        crc, length, kind = HEADER.unpack_from(data, pos)
        if crc == 0 and length == 0 and kind == 0:  # zero fill: nothing written here yet
            raise TornLog(f"zero fill at byte {pos}")
        chunk = data[pos + HEADER.size : pos + HEADER.size + length]
        if len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF != crc:
            raise TornLog(f"chunk at byte {pos} is incomplete or corrupt")
        pos += HEADER.size + length
        if kind in (FULL, FIRST):
            pending = chunk
        elif kind in (MIDDLE, LAST):
            pending += chunk
        else:
            raise TornLog(f"unknown chunk type {kind} at byte {pos}")
        if kind in (FULL, LAST):
            out.append(pending)
            pending = b""
    if pending:
        raise TornLog("the last record is incomplete")
    return out


def records(path: str | Path, *, timeout: float = HANG_GUARD_SECONDS) -> list[Any]:
    """Every record of a finished run, once its ``exit`` record is on disk (waits up to ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    problem = "not read yet"
    while True:
        try:
            parsed = []
            for payload in _payloads(Path(path).read_bytes()):
                record = pb.Record()
                record.ParseFromString(payload)
                parsed.append(record)
            if any(r.WhichOneof("record_type") == "exit" for r in parsed):
                return parsed
            problem = "no exit record yet (call run.finish() first)"
        except TornLog as exc:
            problem = str(exc)
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: {problem} after {timeout} s")
        time.sleep(0.05)


def _value(item: Any) -> Any:
    kind = item.WhichOneof("value")  # newer writers use typed fields, older ones value_json
    if kind == "json":
        return json.loads(item.json)
    if kind not in (None, "none"):
        return getattr(item, kind)
    return json.loads(item.value_json) if item.value_json else None


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """Every history row in the order it was written, as ``{key: value}`` (``_step`` included)."""
    return [
        {(item.key or "/".join(item.nested_key)): _value(item) for item in r.history.item}
        for r in records(path)
        if r.WhichOneof("record_type") == "history"
    ]


def read_metric_definitions(path: str | Path) -> list[tuple[str, str, str]]:
    """``(name or glob_name, step_metric, ...)`` for every ``define_metric`` record in the log."""
    return [
        (r.metric.name, r.metric.glob_name, r.metric.step_metric)
        for r in records(path)
        if r.WhichOneof("record_type") == "metric"
    ]
