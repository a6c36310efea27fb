"""``cwsandbox-async``: the operator's command line; ``python -m cwsandbox_async`` (or ``.cli``) runs it too.

The commands are in ``_commands``; ``doctor`` collects the probes each backend
package contributes (see ``cwsandbox_async.backends.probes``).
"""

from __future__ import annotations

from ._commands import EXIT_CODES, main

__all__ = ["EXIT_CODES", "main"]
