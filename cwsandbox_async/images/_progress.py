"""Progress of a pull: events for a callback, and a tqdm bar built on them (the ``progress`` extra).

A callback gets a :class:`PullProgress` after each chunk of a download and when each layer is
unpacked; it runs on the event loop and must not block. An exception it raises ends the pull.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ProgressCallback", "PullProgress", "tqdm_progress"]


@dataclass(frozen=True)
class PullProgress:
    """Where a pull is: bytes downloaded of the layers it has to download, layers ready of all."""

    reference: str
    event: Literal["download", "layer", "done"]
    downloaded_bytes: int
    download_total_bytes: int
    layers_ready: int
    layers_total: int


ProgressCallback = Callable[[PullProgress], None]


class _Bar:
    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def __call__(self, progress: PullProgress) -> None:
        if self._bar.total != progress.download_total_bytes:
            self._bar.total = progress.download_total_bytes
        self._bar.n = progress.downloaded_bytes
        self._bar.set_postfix_str(f"layers {progress.layers_ready}/{progress.layers_total}", refresh=False)
        if progress.event == "done":
            self._bar.close()
        else:
            self._bar.refresh()


def tqdm_progress(description: str) -> ProgressCallback | None:
    """A callback that draws a tqdm bar on stderr, or None when tqdm is not installed
    (``pip install 'cwsandbox-async[progress]'``). The bar closes on the ``done`` event."""
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:
        return None
    bar = tqdm(total=0, unit="B", unit_scale=True, desc=description, file=sys.stderr, dynamic_ncols=True, leave=True)
    return _Bar(bar)
