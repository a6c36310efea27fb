"""Answering a registry's ``WWW-Authenticate`` challenge: Basic, or a Bearer token from its realm.

Anonymous first: a request goes out without credentials; a 401 names the scheme. For ``Basic``
the credentials found for the registry are sent; for ``Bearer`` a token is asked from the
challenge's ``realm`` with its ``service`` and the repository's pull ``scope`` (with Basic
credentials when there are some, anonymously otherwise) and sent until it expires.
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from .._errors import ImagePullError
from ._credentials import Credentials, find_credentials
from ._http import Retryable, registry_words, retry_after_seconds
from ._options import ImageOptions
from ._reference import Reference

__all__ = ["Authenticator", "Challenge", "parse_challenge"]

_PARAM = re.compile(r'([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))')


@dataclass(frozen=True)
class Challenge:
    """A parsed ``WWW-Authenticate`` header: the scheme (lower case) and its parameters."""

    scheme: str
    params: dict[str, str]


def parse_challenge(header: str | None) -> Challenge | None:
    """``Bearer realm="...",service="...",scope="..."`` -> Challenge; None for an empty header."""
    if not header or not header.strip():
        return None
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _PARAM.finditer(rest)}
    return Challenge(scheme.lower(), params)


def _basic(credentials: Credentials) -> str:
    return "Basic " + base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()


class Authenticator:
    """The ``Authorization`` header for each (registry host, repository), learnt from challenges."""

    def __init__(self, session: aiohttp.ClientSession, options: ImageOptions, auth_files: tuple[Path, ...]) -> None:
        self._session = session
        self._options = options
        self._files = auth_files
        self._headers: dict[tuple[str, str], tuple[str, float]] = {}

    def header(self, host: str, reference: Reference) -> str | None:
        """The header to send to ``host`` for ``reference``'s repository, if one is known and fresh."""
        found = self._headers.get((host, reference.repository))
        if found is None or found[1] < time.monotonic():
            return None
        return found[0]

    async def answer(self, host: str, reference: Reference, www_authenticate: str | None, words: str) -> None:
        """Learn the header that answers a 401 from ``host``.

        Raises ``ImagePullError(infrastructure=False)`` when credentials are needed and none are
        configured, or the token server refuses them (its words in the message); ``Retryable``
        when the token server answers 429/5xx or not at all.
        """
        challenge = parse_challenge(www_authenticate)
        registry = None if host == reference.api_host else host
        credentials = find_credentials(reference, self._files, registry)
        if challenge is None or challenge.scheme == "basic":
            if credentials is None:
                raise ImagePullError(
                    f"{host} needs credentials for {reference.name} and none are configured: {words}",
                    reference=str(reference),
                    infrastructure=False,
                )
            self._headers[(host, reference.repository)] = (_basic(credentials), float("inf"))
            return
        if challenge.scheme != "bearer" or not challenge.params.get("realm"):
            raise ImagePullError(
                f"{host} asks for an authentication this client does not speak: {www_authenticate}",
                reference=str(reference),
                infrastructure=False,
            )
        token, expires_in = await self._token(challenge, reference, credentials)
        self._headers[(host, reference.repository)] = (f"Bearer {token}", time.monotonic() + max(expires_in - 5, 1))

    async def _token(
        self, challenge: Challenge, reference: Reference, credentials: Credentials | None
    ) -> tuple[str, float]:
        params = {"scope": f"repository:{reference.repository}:pull"}
        if challenge.params.get("service"):
            params["service"] = challenge.params["service"]
        headers = {"Authorization": _basic(credentials)} if credentials is not None else {}
        realm = challenge.params["realm"]
        timeout = aiohttp.ClientTimeout(
            total=self._options.request_timeout_seconds, connect=self._options.connect_timeout_seconds
        )
        try:
            async with self._session.get(realm, params=params, headers=headers, timeout=timeout) as response:
                body = await response.read()
                if response.status == 429 or response.status >= 500:
                    raise Retryable(
                        f"token server {realm}: {registry_words(response.status, body)}",
                        retry_after_seconds(response.headers.get("Retry-After")),
                    )
                if response.status != 200:
                    raise ImagePullError(
                        f"token server {realm} refused {'the credentials' if credentials else 'anonymous access'}"
                        f" for {reference.name}: {registry_words(response.status, body)}",
                        reference=str(reference),
                        infrastructure=False,
                    )
                data = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Retryable(f"token server {realm}: {type(exc).__name__}: {exc}") from exc
        except ValueError as exc:
            raise Retryable(f"token server {realm} answered something that is not JSON: {exc}") from exc
        token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise Retryable(f"token server {realm} answered no token")
        expires = data.get("expires_in", 60)
        return token, float(expires) if isinstance(expires, int | float) else 60.0
