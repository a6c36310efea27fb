"""Registry credentials from the files container tools write.

Read in this order, the first file with an entry for the registry winning:

1. ``$REGISTRY_AUTH_FILE`` as podman reads it, else ``$XDG_RUNTIME_DIR/containers/auth.json``
   (podman's default, when it exists);
2. ``$DOCKER_CONFIG/config.json``, default ``~/.docker/config.json``.

Each file's ``auths`` maps a registry (``docker.io``, ``https://index.docker.io/v1/``,
``127.0.0.1:5000``, or podman's ``host/namespace`` scoped to repositories) to ``{"auth":
base64("user:password")}`` or ``{"username": ..., "password": ...}``; the most specific key that
matches wins. Credential helpers (``credsStore``, ``credHelpers``) are not run.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .._errors import ImagePullError
from ._reference import DOCKER_HUB, Reference

__all__ = ["Credentials", "default_auth_files", "find_credentials"]

_HUB_KEYS = ("docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com")


@dataclass(frozen=True)
class Credentials:
    """A user name and password (or token) for one registry; ``source`` is the file it came from."""

    username: str
    password: str
    source: str

    def __repr__(self) -> str:  # never print the password
        return f"Credentials(username={self.username!r}, source={self.source!r})"


def default_auth_files(environ: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The credential files consulted, in order (they need not exist)."""
    env = os.environ if environ is None else environ
    files: list[Path] = []
    if env.get("REGISTRY_AUTH_FILE"):
        files.append(Path(env["REGISTRY_AUTH_FILE"]))
    elif env.get("XDG_RUNTIME_DIR"):
        files.append(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    docker_config = env.get("DOCKER_CONFIG")
    home = env.get("HOME") or str(Path.home())
    files.append(Path(docker_config) / "config.json" if docker_config else Path(home) / ".docker" / "config.json")
    return tuple(files)


def _normalize_key(key: str) -> str:
    for prefix in ("https://", "http://"):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    key = key.rstrip("/")
    for suffix in ("/v1", "/v2"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    host, sep, path = key.partition("/")
    if host in _HUB_KEYS:
        host = DOCKER_HUB
    return host + sep + path


def _decode(entry: object, source: str, key: str) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, sep, password = base64.b64decode(auth, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise ImagePullError(
                f"{source}: the 'auth' of {key!r} is not base64 of user:password", infrastructure=False
            ) from None
        if not sep:
            raise ImagePullError(f"{source}: the 'auth' of {key!r} has no ':'", infrastructure=False)
        return Credentials(user, password, source)
    name, secret = entry.get("username"), entry.get("password")
    if isinstance(name, str) and isinstance(secret, str) and name:
        return Credentials(name, secret, source)
    return None


def _read_auths(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ImagePullError(f"cannot read the credential file {path}: {exc}", infrastructure=False) from exc
    auths = data.get("auths") if isinstance(data, dict) else None
    return auths if isinstance(auths, dict) else {}


def find_credentials(reference: Reference, files: tuple[Path, ...], registry: str | None = None) -> Credentials | None:
    """The credentials for ``reference`` (on ``registry``, default its own), or None for anonymous.

    Raises ``ImagePullError`` (``infrastructure=False``) for a credential file that exists but
    cannot be read or parsed, or an entry whose ``auth`` is not base64 of ``user:password``.
    """
    host = _normalize_key(registry or reference.registry)
    wanted = f"{host}/{reference.repository}"
    for path in files:
        best: tuple[int, str, object] | None = None
        for key, entry in _read_auths(path).items():
            norm = _normalize_key(key)
            matches = norm == host or wanted == norm or wanted.startswith(norm + "/")
            if matches and (best is None or len(norm) > best[0]):
                best = (len(norm), key, entry)
        if best is not None:
            found = _decode(best[2], str(path), best[1])
            if found is not None:
                return found
    return None
