"""Image references, named as Docker and the OCI distribution spec name them.

``python:3.11`` is ``docker.io/library/python:3.11``; ``user/repo`` is on Docker Hub too; a first
component with a dot or a port, or ``localhost``, names a registry (``127.0.0.1:5000/x``,
``ghcr.io/o/r``, ``localhost/x``). A reference may carry a tag, a digest, or both
(``name:tag@sha256:...``: the digest is what is fetched, the tag only documents it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._errors import SandboxValidationError

__all__ = ["DOCKER_HUB", "ImageReferenceError", "Reference", "parse_reference"]

#: Docker Hub's canonical name, and the host its registry API answers on.
DOCKER_HUB = "docker.io"
DOCKER_HUB_API_HOST = "registry-1.docker.io"
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN = re.compile(
    r"(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
    r"|\[[0-9a-fA-F:.]+\])(?::[0-9]{1,5})?"
)
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}")
_MAX_NAME = 255


class ImageReferenceError(SandboxValidationError):
    """A string that is not an image reference (bad characters, an empty part, a malformed digest)."""


@dataclass(frozen=True)
class Reference:
    """A parsed image reference: where it lives, and which manifest it names.

    ``registry`` is the registry's name as written (``docker.io`` for Docker Hub), ``repository``
    the path in it (``library/python``), ``tag`` (``latest`` when neither tag nor digest was
    given) and ``digest`` (``sha256:<hex>``) as given.
    """

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """``registry/repository``, without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def selector(self) -> str:
        """What the manifest endpoint is asked for: the digest if there is one, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def api_host(self) -> str:
        """The host the registry API answers on (Docker Hub's differs from its name)."""
        return DOCKER_HUB_API_HOST if self.registry == DOCKER_HUB else self.registry

    def with_digest(self, digest: str) -> Reference:
        """This reference pinned to ``digest`` (the tag kept as documentation)."""
        return Reference(self.registry, self.repository, self.tag, digest)

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


def _bad(text: str, why: str) -> ImageReferenceError:
    return ImageReferenceError(f"invalid image reference {text!r}: {why}")


def parse_reference(text: str) -> Reference:
    """Parse ``text`` into a normalized :class:`Reference`.

    Raises :class:`ImageReferenceError` (a ``SandboxValidationError``, the caller's mistake) for an
    empty string, upper-case letters in the repository, an empty path component, a malformed tag
    or digest, or a name longer than 255 characters.
    """
    if not isinstance(text, str) or not text or text != text.strip():
        raise _bad(str(text), "empty or surrounded by white space")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise _bad(text, "a digest is sha256:<64 hex digits> (or sha512:<128>)")
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise _bad(text, f"bad tag {tag!r}")
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not _DOMAIN.fullmatch(first):
            raise _bad(text, f"bad registry host {first!r}")
        registry, path = first, remainder
    else:
        registry, path = DOCKER_HUB, rest
    if registry in _HUB_ALIASES:
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    components = path.split("/")
    for component in components:
        if not _COMPONENT.fullmatch(component):
            raise _bad(text, f"bad repository component {component!r} (lower-case letters, digits, . _ -)")
    if len(registry) + 1 + len(path) > _MAX_NAME:
        raise _bad(text, f"the name is longer than {_MAX_NAME} characters")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, path, tag, digest)
