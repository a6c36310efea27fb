"""Find the Python code blocks of the project's Markdown files, with their test directives.

A block is a fence opened by a line of three backticks and ``python`` (or ``py``)
and closed by three backticks. Each block is a whole program: it runs as written,
``python block.py``, so it needs its own imports and its own ``asyncio.run``.

A block may be preceded (blank lines allowed) by one HTML comment that the
rendered page does not show::

    <!-- docs-test: needs=trl,datasets timeout=300 -->

- ``needs=a,b``: modules the block imports from an optional extra; the test
  skips, naming the missing ones, when they are not installed.
- ``timeout=N``: seconds the block may take (default ``DEFAULT_TIMEOUT``).
- ``services=openai,kubernetes``: servers the test starts on 127.0.0.1 for the
  block (an OpenAI-compatible chat endpoint in ``OPENAI_BASE_URL``; a Kubernetes
  API test server in ``KUBECONFIG``).

There is no way to skip a block: a block that cannot run is a documentation bug.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_TIMEOUT", "DIRECTIVE_KEYS", "Block", "blocks", "doc_files"]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT = 120.0
DIRECTIVE_KEYS = frozenset({"needs", "timeout", "services"})

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_DIRECTIVE = re.compile(r"^<!--\s*docs-test:(.*?)-->\s*$")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")


@dataclass(frozen=True)
class Block:
    """One Python block: where it is, its source and its directives."""

    path: Path
    line: int  # 1-based line of the opening fence
    heading: str
    source: str
    needs: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-") or "top"
        return f"{self.path.relative_to(ROOT)}:{self.line}:{slug}"


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/ (new files are picked up automatically)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _parse_directive(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or key not in DIRECTIVE_KEYS:
            raise ValueError(f"{where}: unknown docs-test directive {item!r} (known: {sorted(DIRECTIVE_KEYS)})")
        out[key] = value
    return out


def blocks(path: Path) -> list[Block]:
    """Every Python block of one Markdown file, in order. Raises ``ValueError`` for a malformed file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    heading = ""
    directive: dict[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        where = f"{path.name}:{i + 1}"
        if m := _HEADING.match(line):
            heading, directive = m.group(1), None
        elif m := _DIRECTIVE.match(line.strip()):
            directive = _parse_directive(m.group(1), where)
        elif m := _FENCE.match(line):
            fence, lang = m.group(1), m.group(2).lower()
            end = i + 1
            while end < len(lines) and not lines[end].startswith(fence):
                end += 1
            if end == len(lines):
                raise ValueError(f"{where}: code fence never closed")
            if lang in ("python", "py"):
                d = directive or {}
                found.append(
                    Block(
                        path=path,
                        line=i + 1,
                        heading=heading,
                        source="\n".join(lines[i + 1 : end]) + "\n",
                        needs=tuple(n for n in d.get("needs", "").split(",") if n),
                        services=tuple(s for s in d.get("services", "").split(",") if s),
                        timeout=float(d.get("timeout", DEFAULT_TIMEOUT)),
                        directives=d,
                    )
                )
            elif directive is not None:
                raise ValueError(f"{where}: a docs-test directive before a {lang or 'plain'} block")
            directive = None
            i = end
        elif line.strip() and directive is not None:
            raise ValueError(f"{where}: a docs-test directive must come right before a python block")
        i += 1
    return found
