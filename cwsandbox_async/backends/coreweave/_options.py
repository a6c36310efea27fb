"""Options of the CoreWeave backend: one frozen dataclass, validated once, before any I/O.

Configured the way the ``cwsandbox`` SDK is: ``CWSANDBOX_BASE_URL`` (default
``https://api.cwsandbox.com``; an ``http://`` URL means an insecure channel, for local
testing) and ``CWSANDBOX_API_KEY`` (sent as ``authorization: Bearer ...``), or the
W&B credentials the SDK also accepts (``auth="wandb"``: ``WANDB_API_KEY`` plus the
optional entity and project). Explicit options win over the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlparse

from ..._errors import SandboxBackendUnavailableError, SandboxValidationError
from ..._types import Resources
from ..._validate import validate_number, validate_option_names, validate_optional_str, validate_tags

__all__ = ["DEFAULT_BASE_URL", "UNENFORCED", "AuthMetadata", "CoreWeaveOptions", "Endpoint", "unenforced_limits"]

DEFAULT_BASE_URL = "https://api.cwsandbox.com"
AUTH_MODES = ("auto", "api_key", "wandb", "none")
EXEC_RPCS = ("auto", "unary", "stream")
AuthMetadata = tuple[tuple[str, str], ...]
#: ``Resources`` fields the service has no limit for.
UNENFORCED = ("pids", "tmp_mib")
_LIBRARY_DEFAULTS = Resources()


def unenforced_limits(res: Resources) -> dict[str, int | float]:
    """The limits in ``res`` the service cannot enforce and the caller asked for: those set to something
    other than ``Resources``' own default (a default the caller never chose is not worth a warning)."""
    out: dict[str, int | float] = {}
    for name in UNENFORCED:
        value = getattr(res, name)
        if value is not None and value != getattr(_LIBRARY_DEFAULTS, name):
            out[name] = value
    return out


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the service is: a gRPC ``host:port`` target and whether the channel uses TLS."""

    target: str
    secure: bool


def parse_base_url(url: str) -> Endpoint:
    """``https://host[:port]`` or ``http://host[:port]`` -> Endpoint; ``SandboxValidationError`` otherwise."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https"):
        raise SandboxValidationError(f"base_url must be an http:// or https:// URL, got {url!r}")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise SandboxValidationError(f"base_url must have no path (gRPC has none), got {url!r}")
    try:
        port = parsed.port
    except ValueError as exc:
        raise SandboxValidationError(f"base_url has an invalid port: {url!r}") from exc
    if not parsed.hostname:
        raise SandboxValidationError(f"base_url has no host: {url!r}")
    secure = parsed.scheme == "https"
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return Endpoint(f"{host}:{port or (443 if secure else 80)}", secure)


@dataclass(frozen=True, slots=True)
class CoreWeaveOptions:
    """Everything ``CoreWeaveBackend(**options)`` accepts; see the backend's docstring for each field.

    Raises ``SandboxValidationError`` for an unknown option or a value of the wrong type or range.
    """

    # where and who
    base_url: str | None = None
    api_key: str | None = None
    auth: str = "auto"
    wandb_api_key: str | None = None
    wandb_entity: str | None = None
    wandb_project: str | None = None
    # what: the sandbox
    image: str = "python:3.11"
    annotations: Mapping[str, str] = field(default_factory=dict)
    runtime_class: str | None = None
    # how: API etiquette
    request_timeout_seconds: float = 30.0
    max_in_flight: int = 64
    max_retries: int = 5
    max_retry_delay_seconds: float = 10.0
    ready_poll_seconds: float = 0.2
    exec_rpc: str = "auto"
    exec_slack_seconds: float = 5.0
    kill_after_seconds: float = 2.0
    file_timeout_seconds: float = 300.0
    max_message_bytes: int = 100 * 1024 * 1024
    sweep_on_close: bool = True
    #: tags on every sandbox this backend creates, implied in its list and sweep, hidden from
    #: ``SandboxInfo.tags`` (default ``$CWSANDBOX_ASYNC_SCOPE_TAGS``, comma-separated): one CI run's
    #: sandboxes, found and swept as a whole
    scope_tags: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("base_url", "api_key", "wandb_api_key", "wandb_entity", "wandb_project", "runtime_class"):
            validate_optional_str(getattr(self, name), name)
        validate_optional_str(self.image, "image")
        if self.auth not in AUTH_MODES:
            raise SandboxValidationError(f"auth must be one of {', '.join(AUTH_MODES)}, got {self.auth!r}")
        if self.exec_rpc not in EXEC_RPCS:
            raise SandboxValidationError(f"exec_rpc must be one of {', '.join(EXEC_RPCS)}, got {self.exec_rpc!r}")
        if self.base_url is not None:
            parse_base_url(self.base_url)
        for name in ("request_timeout_seconds", "max_retry_delay_seconds", "ready_poll_seconds"):
            validate_number(getattr(self, name), name)
        for name in ("exec_slack_seconds", "kill_after_seconds", "file_timeout_seconds"):
            validate_number(getattr(self, name), name)
        for name in ("max_in_flight", "max_message_bytes"):
            validate_number(getattr(self, name), name, integer=True)
        validate_number(self.max_retries, "max_retries", integer=True, allow_zero=True)
        if self.scope_tags is not None:
            object.__setattr__(self, "scope_tags", validate_tags(self.scope_tags))
        if not isinstance(self.sweep_on_close, bool):
            raise SandboxValidationError("sweep_on_close must be a bool")
        ann = self.annotations
        if not isinstance(ann, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in ann.items()):
            raise SandboxValidationError("annotations must be a mapping of str to str")
        object.__setattr__(self, "annotations", dict(ann))

    @classmethod
    def from_kwargs(cls, options: Mapping[str, Any]) -> CoreWeaveOptions:
        validate_option_names(options, (f.name for f in fields(cls)), "coreweave backend")
        return cls(**options)

    # -- resolution against the environment (read at first use, not at import) ----------
    def endpoint(self) -> Endpoint:
        """The service's address: ``base_url``, else ``$CWSANDBOX_BASE_URL``, else the public service."""
        return parse_base_url(self.base_url or os.environ.get("CWSANDBOX_BASE_URL") or DEFAULT_BASE_URL)

    def scope(self) -> tuple[str, ...]:
        """``scope_tags``, else ``$CWSANDBOX_ASYNC_SCOPE_TAGS`` split at commas (``SandboxValidationError`` if bad)."""
        if self.scope_tags is not None:
            return self.scope_tags
        raw = os.environ.get("CWSANDBOX_ASYNC_SCOPE_TAGS", "")
        return validate_tags([t.strip() for t in raw.split(",") if t.strip()])

    def auth_metadata(self, endpoint: Endpoint) -> AuthMetadata:
        """The gRPC metadata that authenticates every call.

        ``auto`` uses an API key (option, then ``$CWSANDBOX_API_KEY``), else W&B
        credentials if ``$WANDB_API_KEY`` is set; with neither, an insecure (``http://``)
        endpoint gets no credentials (a local test server) and a TLS one raises
        ``SandboxBackendUnavailableError``.
        """
        key = self.api_key or os.environ.get("CWSANDBOX_API_KEY")
        wandb_key = self.wandb_api_key or os.environ.get("WANDB_API_KEY")
        mode = self.auth
        if mode == "auto":
            mode = "api_key" if key else "wandb" if wandb_key else "none"
            if mode == "none" and endpoint.secure:
                raise SandboxBackendUnavailableError(
                    "no CoreWeave credentials: set CWSANDBOX_API_KEY (or WANDB_API_KEY with auth='wandb')",
                    infrastructure=False,
                )
        if mode == "api_key":
            if not key:
                raise SandboxBackendUnavailableError("auth='api_key' needs CWSANDBOX_API_KEY", infrastructure=False)
            return (("authorization", f"Bearer {key}"),)
        if mode == "wandb":
            if not wandb_key:
                raise SandboxBackendUnavailableError("auth='wandb' needs WANDB_API_KEY", infrastructure=False)
            meta = [("x-wandb-api-key", wandb_key)]
            entity = self.wandb_entity or os.environ.get("WANDB_ENTITY")
            project = self.wandb_project or os.environ.get("WANDB_PROJECT")
            if entity:
                meta.append(("x-entity-id", entity))
            if project:
                meta.append(("x-project-name", project))
            return tuple(meta)
        return ()
