"""The library's logger: structlog when the application configured it, quiet otherwise.

The library never configures logging. If the application called
``structlog.configure``, events go through its processors (with ``sandbox_id``,
``session_id`` and ``step`` merged from contextvars). If it did not, events go to
the standard ``logging`` logger ``"cwsandbox_async"``, which prints nothing below
WARNING unless the application sets up logging. While no handler would take a record
(the application configured nothing), Python prints it through ``logging.lastResort``,
which writes the bare message; such a record then says itself who wrote it, in
``logging.basicConfig``'s format (``WARNING:cwsandbox_async:event key=value ...``).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["bound", "log"]

_stdlib = logging.getLogger("cwsandbox_async")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class _Logger:
    """Forward to structlog if configured, else to the stdlib logger (cheap when filtered)."""

    __slots__ = ()

    def _emit(self, level: str, event: str, kw: dict[str, Any]) -> None:
        if structlog.is_configured():
            getattr(structlog.get_logger("cwsandbox_async"), level)(event, **kw)
            return
        lvl = _LEVELS[level]
        if not _stdlib.isEnabledFor(lvl):
            return
        ctx = {**structlog.contextvars.get_contextvars(), **kw}
        detail = " ".join(f"{k}={v!r}" for k, v in ctx.items())
        if _stdlib.hasHandlers():
            _stdlib.log(lvl, "%s %s", event, detail)
        else:  # for logging.lastResort, which prints the message alone
            _stdlib.log(lvl, "%s:%s:%s %s", logging.getLevelName(lvl), _stdlib.name, event, detail)

    def debug(self, event: str, **kw: Any) -> None:
        self._emit("debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._emit("info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._emit("warning", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._emit("error", event, kw)


log = _Logger()
bound = structlog.contextvars.bound_contextvars
