"""Code extraction from completions: tags, fences, conversational messages."""

from __future__ import annotations

import pytest

from cwsandbox_async.integrations._extract import completion_text, extract_code


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("<answer>x = 1</answer>", "x = 1"),
        ("a <answer>x = 1</answer> b <answer>y = 2</answer>", "y = 2"),
        ("<ANSWER>\n  x = 1\n  y = 2\n</ANSWER>", "x = 1\ny = 2"),
        ("<answer>```python\nx = 1\n```</answer>", "x = 1"),
        ("<answer>x = 1", "x = 1"),  # unclosed last tag runs to the end
        ("text\n```python\nx = 1\n```\nmore\n```py\ny = 2\n```", "y = 2"),
        ("```\nz = 3\n```", "z = 3"),
        ("no code at all", None),
        ("<answer>   \n </answer>", None),
        ("", None),
    ],
)
def test_extract_code(text: str, code: str | None) -> None:
    assert extract_code(text) == code


def test_completion_text_forms() -> None:
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]) == "a\nb"
    assert completion_text([{"role": "user", "content": "u"}]) == "u"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}]
    assert completion_text(parts) == "xy"
    assert completion_text({"role": "assistant", "content": None}) == ""
    assert completion_text(None) == ""
