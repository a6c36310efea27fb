"""The local backend: sandboxes isolated with bubblewrap on this machine (the embedded default).

``load_backend("local", **options)`` imports this package and builds a
``LocalBackend``; see its docstring for the options and ``_backend`` for the
limits and what enforces them.
"""

from __future__ import annotations

from ._backend import DEFAULT_PRELOAD, LocalBackend

__all__ = ["DEFAULT_PRELOAD", "LocalBackend"]
