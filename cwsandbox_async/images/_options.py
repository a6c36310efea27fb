"""Settings of the image layer: one typed options object, also read from the environment.

The environment names are the ones container tools' users expect:

- ``CWSANDBOX_IMAGE_CACHE``: the cache directory (default ``~/.cache/cwsandbox_async/images``,
  under ``$XDG_CACHE_HOME`` when that is set);
- ``CWSANDBOX_INSECURE_REGISTRIES``: comma-separated ``host:port`` reached over plain HTTP
  (loopback registries, ``localhost``/``127.*``/``[::1]``, always are);
- ``CWSANDBOX_REGISTRY_MIRRORS``: comma-separated ``registry=host:port`` (``docker.io=127.0.0.1:5000``),
  tried in order before the registry itself;
- ``CWSANDBOX_IMAGE_CACHE_MAX_BYTES``: after each pull, least-recently-used images are removed
  until the cache fits (unset: no cap).
"""

from __future__ import annotations

import ipaddress
import os
import platform as _platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .._errors import SandboxValidationError

__all__ = ["ImageOptions", "Platform", "PullPolicy", "host_platform"]

PullPolicy = Literal["missing", "always"]

_ARCH = {
    "x86_64": ("amd64", None),
    "amd64": ("amd64", None),
    "aarch64": ("arm64", "v8"),
    "arm64": ("arm64", "v8"),
    "armv7l": ("arm", "v7"),
    "armv6l": ("arm", "v6"),
    "i686": ("386", None),
    "ppc64le": ("ppc64le", None),
    "s390x": ("s390x", None),
    "riscv64": ("riscv64", None),
}


@dataclass(frozen=True)
class Platform:
    """An OCI platform: ``os``/``architecture`` and an optional ``variant`` (``linux/arm64/v8``)."""

    os: str = "linux"
    architecture: str = "amd64"
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> Platform:
        """``linux/amd64`` or ``linux/arm/v7``; a ``SandboxValidationError`` for anything else."""
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise SandboxValidationError(f"a platform is os/architecture[/variant], not {text!r}")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


def host_platform() -> Platform:
    """The platform of this machine (``linux/amd64`` here)."""
    arch, variant = _ARCH.get(_platform.machine().lower(), (_platform.machine().lower(), None))
    return Platform("linux", arch, variant)


def _default_cache_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "cwsandbox_async" / "images"


def _split(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _mirrors(value: str | None) -> dict[str, tuple[str, ...]]:
    mirrors: dict[str, list[str]] = {}
    for item in _split(value):
        registry, sep, host = item.partition("=")
        if not sep or not registry.strip() or not host.strip():
            raise SandboxValidationError(f"CWSANDBOX_REGISTRY_MIRRORS: {item!r} is not registry=host:port")
        mirrors.setdefault(registry.strip(), []).append(host.strip())
    return {registry: tuple(hosts) for registry, hosts in mirrors.items()}


def is_loopback(host: str) -> bool:
    """Whether ``host[:port]`` names this machine (``localhost``, 127.0.0.0/8, ``[::1]``)."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ImageOptions:
    """How images are pulled and cached. :meth:`from_env` reads the ``CWSANDBOX_*`` variables.

    Bounds: ``max_layer_bytes`` and ``max_layer_entries`` refuse a layer whose unpacked content
    would pass them (a decompression bomb); ``request_timeout_seconds`` is the deadline of each
    manifest and token request, and of each read of a blob (a stalled download fails, a slow one
    that keeps moving does not); ``pull_timeout_seconds`` bounds a whole pull.
    """

    cache_dir: Path = field(default_factory=lambda: _default_cache_dir(os.environ))
    insecure_registries: frozenset[str] = frozenset()
    mirrors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    platform: Platform = field(default_factory=host_platform)
    pull_policy: PullPolicy = "missing"
    max_cache_bytes: int | None = None
    request_timeout_seconds: float = 30.0
    connect_timeout_seconds: float = 10.0
    pull_timeout_seconds: float = 3600.0
    attempts: int = 5
    max_backoff_seconds: float = 30.0
    max_concurrent_downloads: int = 3
    max_layer_bytes: int = 64 * 2**30
    max_layer_entries: int = 2_000_000
    keep_layer_blobs: bool = False
    auth_files: tuple[Path, ...] | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> ImageOptions:
        """Options from the environment (``os.environ`` by default); ``overrides`` win.

        Raises ``SandboxValidationError`` for a malformed variable.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {
            "cache_dir": Path(env["CWSANDBOX_IMAGE_CACHE"]) if env.get("CWSANDBOX_IMAGE_CACHE") else None,
            "insecure_registries": frozenset(_split(env.get("CWSANDBOX_INSECURE_REGISTRIES"))),
            "mirrors": _mirrors(env.get("CWSANDBOX_REGISTRY_MIRRORS")),
        }
        if values["cache_dir"] is None:
            values["cache_dir"] = _default_cache_dir(env)
        cap = env.get("CWSANDBOX_IMAGE_CACHE_MAX_BYTES")
        if cap:
            try:
                values["max_cache_bytes"] = int(cap)
            except ValueError:
                raise SandboxValidationError(f"CWSANDBOX_IMAGE_CACHE_MAX_BYTES is not an integer: {cap!r}") from None
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    def is_insecure(self, host: str) -> bool:
        """Whether ``host[:port]`` is spoken to over plain HTTP."""
        return host in self.insecure_registries or is_loopback(host)
