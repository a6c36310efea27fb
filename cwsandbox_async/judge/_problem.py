"""A problem as the dataset adapters produce it: its test cases, and the function name of call-based ones."""

from __future__ import annotations

from dataclasses import dataclass

from ._types import TestCase

__all__ = ["Problem"]


@dataclass(frozen=True, slots=True)
class Problem:
    """Test cases (``TestCase``) of one dataset row; ``fn_name`` is set for call-based problems (Python)."""

    cases: tuple[TestCase, ...]
    fn_name: str | None = None
    name: str = ""

    def __len__(self) -> int:
        return len(self.cases)
