"""The CoreWeave backend's doctor probes: credentials present? Does the endpoint answer? Creates nothing.

It resolves the endpoint and the credentials exactly as the backend would
(``base_url`` / ``$CWSANDBOX_BASE_URL``; ``api_key`` / ``$CWSANDBOX_API_KEY`` or the
W&B key), then makes one read-only call (``ListSandboxes``, page size 1, this
library's tag) under ``request.timeout_seconds``. Nothing configured is ``skip``
unless CoreWeave was asked for by name (then ``fail``); a configured endpoint that
does not answer, or refuses the credentials, is ``warn`` (``fail`` when asked for).
The contract is in ``cwsandbox_async.backends.probes``.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import anyio

from ..._errors import SandboxError
from ..probes import FAIL, OK, SKIP, WARN, DoctorRequest, Section

__all__ = ["credential_source", "probe"]


def credential_source(options: Any) -> str | None:
    """Where the credentials come from (never the secret itself), or None."""
    if options.auth in ("auto", "api_key"):
        if options.api_key:
            return "the api_key option"
        if os.environ.get("CWSANDBOX_API_KEY"):
            return "CWSANDBOX_API_KEY"
    if options.auth in ("auto", "wandb") and (options.wandb_api_key or os.environ.get("WANDB_API_KEY")):
        return "a W&B API key"
    return None


async def probe(section: Section, request: DoctorRequest) -> None:
    """Credentials present? Endpoint answers a read-only call?"""
    from . import EXTRA_HINT

    missing = [m for m in ("grpc", "cwsandbox") if importlib.util.find_spec(m) is None]
    if missing:
        section.add("importable", FAIL if request.explicit else SKIP, f"{', '.join(missing)} missing: {EXTRA_HINT}")
        return
    from cwsandbox._proto import sandbox_pb2 as pb

    from ._channel import RpcError, open_channel
    from ._convert import MANAGED_TAG
    from ._errors import translate
    from ._options import CoreWeaveOptions

    explicit = request.explicit
    try:
        opts = CoreWeaveOptions.from_kwargs(dict(request.options))
        endpoint = opts.endpoint()
    except SandboxError as exc:
        section.add("config", FAIL, str(exc), "parse the options and CWSANDBOX_BASE_URL")
        return
    source = credential_source(opts)
    configured = source is not None or bool(opts.base_url or os.environ.get("CWSANDBOX_BASE_URL"))
    if not configured and not explicit:
        section.add("credentials", SKIP, "no CWSANDBOX_API_KEY (or W&B key) and no CWSANDBOX_BASE_URL", "look")
        return
    section.facts.update(endpoint=endpoint.target, tls=endpoint.secure)
    try:
        metadata = opts.auth_metadata(endpoint)
    except SandboxError as exc:
        section.add("credentials", FAIL if explicit else WARN, str(exc), "resolve the credentials")
        return
    if source is None:
        section.add("credentials", WARN, f"none: {endpoint.target} is an insecure test endpoint", "resolve")
    else:
        section.add("credentials", OK, f"from {source}", "resolve the credentials")
    channel = await open_channel(opts, endpoint, metadata)
    check = "ListSandboxes (page size 1), read-only"
    try:
        with anyio.fail_after(request.timeout_seconds):
            resp = await channel.unary("ListSandboxes", pb.ListSandboxesRequest(page_size=1, tags=[MANAGED_TAG]))
        more = " (or more)" if resp.next_page_token else ""
        section.add("reachable", OK, f"{endpoint.target} answered; {len(resp.sandboxes)}{more} sandboxes", check)
    except RpcError as exc:
        error = translate(exc.failure, "list sandboxes")
        section.add("reachable", FAIL if explicit else WARN, f"{type(error).__name__}: {error}", check)
    except TimeoutError:
        section.add("reachable", FAIL if explicit else WARN, f"no answer in {request.timeout_seconds:g} s", check)
    finally:
        with request.cleanup():
            await channel.aclose()
