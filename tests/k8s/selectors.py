"""Label and field selectors as the API server parses them (the subset pods support)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SelectorError", "field_matcher", "label_matcher"]

Matcher = Callable[[Mapping[str, str]], bool]


class SelectorError(ValueError):
    pass


def _split(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


_SET = re.compile(r"^([^\s!=()]+)\s+(in|notin)\s+\(([^)]*)\)$")
_CMP = re.compile(r"^([^\s!=()]+)\s*(==|!=|=)\s*([^\s!=(),]*)$")
_KEY = re.compile(r"^(!?)([^\s!=(),]+)$")


def label_matcher(selector: str) -> Matcher:
    """``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a)``, ``k``, ``!k``; comma means AND."""
    tests: list[Matcher] = []
    for part in _split(selector or ""):
        if m := _SET.match(part):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                tests.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                tests.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif m := _CMP.match(part):
            key, op, value = m.groups()
            if op == "!=":
                tests.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                tests.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif m := _KEY.match(part):
            neg, key = m.groups()
            tests.append((lambda lb, k=key: k not in lb) if neg else (lambda lb, k=key: k in lb))
        else:
            raise SelectorError(f"unable to parse requirement: {part!r}")
    return lambda labels: all(t(labels) for t in tests)


_FIELDS = {
    "metadata.name": lambda p: p["metadata"]["name"],
    "metadata.namespace": lambda p: p["metadata"].get("namespace", ""),
    "spec.nodeName": lambda p: p["spec"].get("nodeName", ""),
    "spec.restartPolicy": lambda p: p["spec"].get("restartPolicy", ""),
    "status.phase": lambda p: p.get("status", {}).get("phase", ""),
}


def field_matcher(selector: str) -> Callable[[dict[str, Any]], bool]:
    tests: list[Callable[[dict[str, Any]], bool]] = []
    for part in _split(selector or ""):
        m = _CMP.match(part)
        if not m or m.group(1) not in _FIELDS:
            raise SelectorError(f'field label not supported: "{part}"')
        key, op, value = m.groups()
        get = _FIELDS[key]
        if op == "!=":
            tests.append(lambda p, g=get, v=value: g(p) != v)
        else:
            tests.append(lambda p, g=get, v=value: g(p) == v)
    return lambda pod: all(t(pod) for t in tests)
