"""Read the history rows back from a finished offline W&B run's ``.wandb`` transaction log.

The file is a 7-byte header (``b":W&B"``, 0xBEE1, version 0) followed by LevelDB-log
chunks in 32 KiB blocks (``<IHB`` crc32, length, type 1 full / 2 first / 3 middle /
4 last). Each payload is a ``wandb_internal_pb2.Record``; history rows live in
``record.history.item``. Call ``run.finish()`` before reading: the log is flushed late.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32 * 1024
HEADER = struct.Struct("<IHB")


def _payloads(data: bytes) -> list[bytes]:
    magic, ident, version = struct.unpack_from("<4sHB", data)
    assert (magic, ident, version) == (b":W&B", 0xBEE1, 0), "not a W&B transaction log"
    out: list[bytes] = []
    pos, pending = 7, b""
    while pos + HEADER.size <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER.size:  # the block's tail is padding
            pos += room
            continue
        _crc, length, kind = HEADER.unpack_from(data, pos)
        chunk = data[pos + HEADER.size : pos + HEADER.size + length]
        pos += HEADER.size + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            out.append(pending)
            pending = b""
    return out


def _value(item: Any) -> Any:
    kind = item.WhichOneof("value")  # newer writers use typed fields, older ones value_json
    if kind == "json":
        return json.loads(item.json)
    if kind not in (None, "none"):
        return getattr(item, kind)
    return json.loads(item.value_json) if item.value_json else None


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """Every history row in the order it was written, as ``{key: value}`` (``_step`` included)."""
    rows: list[dict[str, Any]] = []
    for payload in _payloads(Path(path).read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append({(item.key or "/".join(item.nested_key)): _value(item) for item in record.history.item})
    return rows


def read_metric_definitions(path: str | Path) -> list[tuple[str, str, str]]:
    """``(name or glob_name, step_metric, ...)`` for every ``define_metric`` record in the log."""
    defs: list[tuple[str, str, str]] = []
    for payload in _payloads(Path(path).read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "metric":
            m = record.metric
            defs.append((m.name, m.glob_name, m.step_metric))
    return defs
