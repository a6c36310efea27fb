"""Every scoring path against every attack that applies to its shape: one test per cell.

A cell holds when the path gives the attack its honest score (and kind, where the corpus names
one) and, in a reused sandbox, the completions around it still score what they deserve. The
expected failures are ``corpus.KNOWN_LIMITATIONS`` (strict), and only those.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from .conftest import Results
from .corpus import ATTACKS, KNOWN_LIMITATIONS, Attack
from .paths import PATHS, Path, Seen


def _cells() -> list[Any]:
    cells = []
    for path in PATHS:
        for attack in ATTACKS:
            if not path.applies(attack):
                continue
            why = KNOWN_LIMITATIONS.get((attack.name, path.mechanism.name))
            marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
            cells.append(pytest.param(path, attack, id=f"{path.id}:{attack.name}", marks=marks))
    return cells


def _same_score(got: float | None, want: float) -> bool:
    return got is not None and math.isclose(got, want, abs_tol=1e-9)


def _problem(label: str, want: float, want_kind: str | None, seen: Seen) -> str | None:
    if seen.raised is None and _same_score(seen.score, want) and (want_kind is None or seen.kind == want_kind):
        return None
    kind = f" ({want_kind})" if want_kind else ""
    return f"{label}: expected {want!r}{kind}, got {seen.describe()}"


# The first cell of a path scores the whole path (every attack at once); see conftest.Results.
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("path", "attack"), _cells())
async def test_cell(path: Path, attack: Attack, attack_results: Results) -> None:
    outcome = (await attack_results.of(path))[attack.name]
    kind = str(attack.kind) if attack.kind is not None else None
    problems = [_problem("the completion", attack.score, kind, outcome.attack)]
    problems += [_problem(label, want, None, seen) for label, want, seen in outcome.neighbours]
    found = [p for p in problems if p is not None]
    assert not found, f"{attack.name} ({attack.category}) x {path.id}:\n  " + "\n  ".join(found)


def test_the_matrix_is_big_enough() -> None:
    """At least 40 programs, every path has cells, and every shape's honest programs are there."""
    assert len(ATTACKS) >= 40
    for path in PATHS:
        assert any(path.applies(a) for a in ATTACKS), path.id
    assert {a.name for a in ATTACKS if a.category != "control" and a.score != 0.0} == set()
