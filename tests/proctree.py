"""Process trees as the tests see them: every live descendant of a process, through every thread."""

from __future__ import annotations

import os

__all__ = ["descendants", "is_zombie"]


def descendants(root: int | None = None) -> set[int]:
    """Live (non-zombie) descendants of ``root`` (this process by default), through every thread."""
    root = os.getpid() if root is None else root
    out: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in out and not is_zombie(kid):
                    out.add(kid)
                    todo.append(kid)
    return out


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True
