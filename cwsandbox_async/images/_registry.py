"""A registry v2 HTTP API client over aiohttp: manifests, and blobs streamed to disk.

Every request has a deadline (``request_timeout_seconds``: the whole of a manifest request, each
read of a blob), is answered once for a 401 challenge (``_auth``), and is retried for 429/5xx
and connection failures (``_http.with_retries``). A blob is written to a temporary file next to
its destination, its sha256 checked, and only then renamed into place; a mismatch deletes it and
raises ``ImagePullError(infrastructure=True)``. Errors the caller made (no such image, refused
credentials) are ``ImagePullError(infrastructure=False)`` with the registry's words.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from .._errors import ImagePullError
from ._auth import Authenticator
from ._http import Retryable, registry_words, retry_after_seconds, with_retries
from ._manifest import ACCEPT, media_type_of
from ._options import ImageOptions
from ._reference import Reference

__all__ = ["Endpoint", "RegistryClient", "endpoints_for"]

_CHUNK = 1 << 16


@dataclass(frozen=True)
class Endpoint:
    """Where a repository's API is reached: ``scheme://host`` (a mirror, or the registry itself)."""

    host: str
    scheme: str

    def url(self, reference: Reference, kind: str, selector: str) -> str:
        return f"{self.scheme}://{self.host}/v2/{reference.repository}/{kind}/{selector}"


def endpoints_for(reference: Reference, options: ImageOptions) -> tuple[Endpoint, ...]:
    """The mirrors configured for the reference's registry, in order, then the registry itself."""
    hosts = [*options.mirrors.get(reference.registry, ()), reference.api_host]
    return tuple(Endpoint(host, "http" if options.is_insecure(host) else "https") for host in hosts)


class RegistryClient:
    """Talks to registries for one pull (or many): holds the session and the learnt auth headers."""

    def __init__(self, session: aiohttp.ClientSession, options: ImageOptions, auth: Authenticator) -> None:
        self._session = session
        self._options = options
        self._auth = auth

    @contextlib.asynccontextmanager
    async def _get(
        self,
        endpoint: Endpoint,
        reference: Reference,
        url: str,
        headers: dict[str, str],
        deadlines: aiohttp.ClientTimeout,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One GET, answered once for a 401; yields a 200 response. Raises per the module doc."""
        for answered in (False, True):
            sent = dict(headers)
            auth = self._auth.header(endpoint.host, reference)
            if auth is not None:
                sent["Authorization"] = auth
            try:
                async with self._session.get(url, headers=sent, timeout=deadlines) as response:
                    if response.status == 200:
                        yield response
                        return
                    body = await response.read()
                    words = registry_words(response.status, body)
                    if response.status == 401 and not answered:
                        challenge = response.headers.get("WWW-Authenticate")
                    elif response.status == 429 or response.status >= 500:
                        raise Retryable(f"{url}: {words}", retry_after_seconds(response.headers.get("Retry-After")))
                    else:
                        what = {401: "refused the credentials", 403: "refused access", 404: "has no"}.get(
                            response.status, "refused the request for"
                        )
                        raise ImagePullError(
                            f"{endpoint.host} {what} {reference}: {words}",
                            reference=str(reference),
                            infrastructure=False,
                        )
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise Retryable(f"{url}: {type(exc).__name__}: {exc}") from exc
            await self._auth.answer(endpoint.host, reference, challenge, words)
        raise AssertionError("unreachable")  # pragma: no cover

    async def manifest(self, endpoint: Endpoint, reference: Reference, selector: str) -> tuple[bytes, str, str]:
        """GET a manifest or index: (body, media type, its sha256 digest).

        The body is bounded (4 MiB, as registries bound it). When ``selector`` is a digest, the
        body must hash to it (``ImagePullError(infrastructure=True)`` otherwise).
        """
        url = endpoint.url(reference, "manifests", selector)
        timeout = aiohttp.ClientTimeout(
            total=self._options.request_timeout_seconds, connect=self._options.connect_timeout_seconds
        )

        async def attempt() -> tuple[bytes, str, str]:
            async with self._get(endpoint, reference, url, {"Accept": ACCEPT}, timeout) as response:
                try:
                    body = await response.content.read(4 * 2**20 + 1)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise Retryable(f"{url}: {type(exc).__name__}: {exc}") from exc
                content_type = response.headers.get("Content-Type")
            if len(body) > 4 * 2**20:
                raise ImagePullError(f"{url}: the manifest is larger than 4 MiB", infrastructure=False)
            return body, media_type_of(body, content_type), "sha256:" + hashlib.sha256(body).hexdigest()

        body, media_type, digest = await with_retries(self._options, f"GET {url}", attempt)
        if selector.startswith("sha256:") and digest != selector:
            raise ImagePullError(
                f"{url}: the manifest's digest is {digest}, not the {selector} asked for", reference=str(reference)
            )
        return body, media_type, digest

    async def blob(
        self,
        endpoint: Endpoint,
        reference: Reference,
        digest: str,
        dest: Path,
        on_bytes: Callable[[int], None] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        """Stream a blob to ``dest``: a temp file beside it, sha256 checked, then renamed.

        Nothing is left at ``dest`` or in the temp file when this raises. ``max_bytes`` (the size
        the manifest announced) bounds what is read: a longer body is a mismatch.
        """
        url = endpoint.url(reference, "blobs", digest)
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self._options.connect_timeout_seconds,
            sock_read=self._options.request_timeout_seconds,
        )
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{id(self):x}.part")

        async def attempt() -> str:
            hasher = hashlib.sha256()
            written = 0
            try:
                async with self._get(endpoint, reference, url, {}, timeout) as response:
                    with open(tmp, "wb") as out:  # noqa: ASYNC230 - page-cache writes of 64 KiB chunks
                        async for chunk in response.content.iter_chunked(_CHUNK):
                            if max_bytes is not None and written + len(chunk) > max_bytes:
                                return "(a body longer than the manifest says)"
                            written += len(chunk)
                            hasher.update(chunk)
                            out.write(chunk)
                            if on_bytes is not None:
                                on_bytes(len(chunk))
            except BaseException as exc:
                tmp.unlink(missing_ok=True)
                if on_bytes is not None and written:
                    on_bytes(-written)  # the progress of a retry starts over
                if isinstance(exc, aiohttp.ClientError | TimeoutError):
                    raise Retryable(f"{url}: {type(exc).__name__}: {exc}") from exc
                raise
            return "sha256:" + hasher.hexdigest()

        got = await with_retries(self._options, f"GET {url}", attempt)
        if got != digest:
            tmp.unlink(missing_ok=True)
            raise ImagePullError(
                f"{url}: the blob's content hashes to {got}, not {digest}: refused, nothing kept",
                reference=str(reference),
                infrastructure=True,
            )
        os.replace(tmp, dest)
