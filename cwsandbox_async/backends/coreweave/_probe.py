"""The doctor's probe: are CoreWeave credentials present, and does the endpoint answer? Creates nothing.

``await probe(**options)`` resolves the endpoint and credentials exactly as the backend
would, then makes one ``ListSandboxes`` call (page size 1, this library's tag) under
``request_timeout_seconds``. Never raises for what it finds: the result says it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import anyio

from ..._errors import SandboxError

__all__ = ["ProbeResult", "probe"]


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What the probe found. ``reachable`` is None when it did not try (no credentials for a TLS endpoint)."""

    endpoint: str
    secure: bool
    credentials: str | None
    reachable: bool | None
    detail: str

    @property
    def ok(self) -> bool:
        return bool(self.reachable)


def _credential_source(options: Any) -> str | None:
    if options.api_key:
        return "api_key option"
    if os.environ.get("CWSANDBOX_API_KEY") and options.auth in ("auto", "api_key"):
        return "CWSANDBOX_API_KEY"
    if (options.wandb_api_key or os.environ.get("WANDB_API_KEY")) and options.auth in ("auto", "wandb"):
        return "W&B API key"
    return None


async def probe(**options: Any) -> ProbeResult:
    """Check configuration, credentials and one read-only call; see the module docstring."""
    from ._channel import Channel, RpcError
    from ._convert import MANAGED_TAG
    from ._errors import translate
    from ._options import CoreWeaveOptions

    try:
        opts = CoreWeaveOptions.from_kwargs(options)
        endpoint = opts.endpoint()
    except SandboxError as exc:
        return ProbeResult(str(options.get("base_url", "")), False, None, None, f"bad configuration: {exc}")
    source = _credential_source(opts)
    try:
        metadata = opts.auth_metadata(endpoint)
    except SandboxError as exc:
        return ProbeResult(endpoint.target, endpoint.secure, source, None, str(exc))
    from cwsandbox._proto import sandbox_pb2 as pb

    channel = Channel(opts, endpoint, metadata)
    try:
        with anyio.fail_after(opts.request_timeout_seconds + 1):
            resp = await channel.unary(
                "ListSandboxes", pb.ListSandboxesRequest(page_size=1, tags=[MANAGED_TAG]), idempotent=True
            )
        more = " or more" if resp.next_page_token else ""
        detail = f"ListSandboxes answered ({len(resp.sandboxes)}{more} of this library's sandboxes)"
        return ProbeResult(endpoint.target, endpoint.secure, source, True, detail)
    except RpcError as exc:
        return ProbeResult(endpoint.target, endpoint.secure, source, False, str(translate(exc.failure, "list")))
    except TimeoutError:
        return ProbeResult(endpoint.target, endpoint.secure, source, False, "no answer in time")
    finally:
        with anyio.CancelScope(shield=True):
            await channel.aclose()
