"""Turn a model completion into code: text of standard or conversational completions, then the code in it."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["clean_text", "completion_text", "extract_code", "foreign_fence"]

_ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_ANY_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+#.-]+)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (which cannot be encoded as UTF-8) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _content_text(content: Any) -> str:
    """A message's ``content``: a str, or a list of parts (``{"type": "text", "text": ...}``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def completion_text(completion: Any) -> str:
    """The text of one completion as TRL passes it.

    Standard datasets give a ``str``. Conversational ones give a list of messages
    (``[{"role": "assistant", "content": ...}]``); the assistant messages' contents
    are joined (all messages' if none is marked assistant). A single message dict is
    accepted too. Anything else is ``str()``-ed. Never raises.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, Mapping)]
        chosen = [m for m in messages if m.get("role") == "assistant"] or messages
        return "\n".join(_content_text(m.get("content")) for m in chosen)
    return "" if completion is None else str(completion)


def _unfence(code: str) -> str:
    """Strip a ```python fence wrapped around code (models often fence inside <answer>)."""
    match = _FENCE_RE.search(code)
    return match.group(1) if match else code


def extract_code(text: str) -> str | None:
    """The code in a completion, or ``None`` if it has none.

    Looks, in order, for the last ``<answer>...</answer>`` block (an unclosed last
    tag runs to the end; a fence inside it is stripped), then the last fenced
    block (```` ```python ````, ```` ```py ```` or a bare ```` ``` ````). The code is
    dedented (models often indent inside tags). Whitespace-only
    code counts as none. Lone surrogates become U+FFFD. Never raises.
    """
    if not isinstance(text, str):
        return None
    text = clean_text(text)
    answers = _ANSWER_RE.findall(text)
    if answers:
        code = textwrap.dedent(_unfence(answers[-1])).strip("\n")
        return code if code.strip() else None
    fences = _FENCE_RE.findall(text)
    if fences:
        code = textwrap.dedent(fences[-1]).strip("\n")
        return code if code.strip() else None
    return None


def foreign_fence(text: str) -> str | None:
    """The language tag of a completion's last fenced block when it holds code and is not Python, else ``None``.

    What ``extract_code`` found no Python in may still be code: a program fenced as ```` ```cpp ````
    is a program in a language this reward does not run, which the reward scores (0.0,
    ``compile_error``) rather than leaving unscored as "no code". Never raises.
    """
    if not isinstance(text, str):
        return None
    fences = [(tag, body) for tag, body in _ANY_FENCE_RE.findall(clean_text(text)) if body.strip()]
    if not fences:
        return None
    tag = fences[-1][0]
    return None if tag.lower() in ("python", "python3", "py") else tag
