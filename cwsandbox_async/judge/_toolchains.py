"""Is a language's toolchain in the sandbox? Checked once per session and language, before any scoring.

The check runs the language's ``version`` command in a sandbox of the session. Its answer (the
version text, or the ``ToolchainError``) is kept for the session's life, so 64 completions
judged at once start one check, not 64. A check the platform could not finish (an
infrastructure error) is not kept: the next judgement asks again.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import anyio

from .._errors import SandboxError
from .._log import log
from ._languages import Language
from ._types import ToolchainError

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._session import Session

__all__ = ["ToolchainCache", "fill"]

VERSION_TIMEOUT_SECONDS = 30.0


def fill(argv: tuple[str, ...], values: dict[str, str]) -> list[str]:
    """``argv`` with ``{name}`` placeholders replaced (unknown braces are left as they are)."""
    out = []
    for arg in argv:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


class ToolchainCache:
    """Version checks per session (weakly keyed: a closed, dropped session takes its answers with it)."""

    def __init__(self) -> None:
        self._known: weakref.WeakKeyDictionary[Session, dict[str, str | ToolchainError]] = weakref.WeakKeyDictionary()
        self._locks: weakref.WeakKeyDictionary[Session, dict[str, anyio.Lock]] = weakref.WeakKeyDictionary()

    def known(self, session: Session, language: Language) -> str | ToolchainError | None:
        return self._known.get(session, {}).get(language.name)

    async def check(self, session: Session, sandbox: Sandbox, language: Language, values: dict[str, str]) -> str:
        """The version text; ``ToolchainError`` (cached) when the command is missing or fails."""
        locks = self._locks.setdefault(session, {})
        lock = locks.setdefault(language.name, anyio.Lock())
        async with lock:
            found = self.known(session, language)
            if found is None:
                found = await self._run(sandbox, language, values)
                self._known.setdefault(session, {})[language.name] = found
                log.info("toolchain checked", language=language.name, ok=isinstance(found, str))
        if isinstance(found, ToolchainError):
            raise found
        return found

    @staticmethod
    async def _run(sandbox: Sandbox, language: Language, values: dict[str, str]) -> str | ToolchainError:
        argv = fill(language.version, values)
        env = {k: fill((v,), values)[0] for k, v in language.env.items()}
        try:
            result = await sandbox.exec(argv, env=env, timeout_seconds=VERSION_TIMEOUT_SECONDS, cwd="/tmp")
        except SandboxError as exc:
            if exc.infrastructure:
                raise  # not an answer about the toolchain: ask again next time
            return ToolchainError(
                f"{language.name}: {' '.join(argv)!r} did not finish: {exc.message}",
                language=language.name,
                sandbox_id=sandbox.sandbox_id,
            )
        text = (result.stdout + result.stderr).strip()
        if result.returncode != 0:
            hint = (
                " (not found: is it installed in the image, on PATH, or exposed to the sandbox?)"
                if result.returncode == 127
                else ""
            )
            return ToolchainError(
                f"{language.name}: {' '.join(argv)!r} exited {result.returncode}{hint}: {text[-500:]}",
                language=language.name,
                output=text[-2000:],
                sandbox_id=sandbox.sandbox_id,
            )
        return text.splitlines()[0] if text else ""
