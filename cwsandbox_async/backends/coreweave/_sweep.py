"""Bulk cleanup: ``PurgeSandboxes``, one call for every sandbox carrying some tags.

The SDK never calls ``PurgeSandboxes``; here it ends a backend (``aclose`` purges the
sandboxes of this backend instance by its creator tag, which also catches a create
whose answer was lost and a delete the service acknowledged without doing) and serves
``CoreWeaveBackend.sweep`` when that selects exactly the sandboxes to delete.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from ..._log import log
from ._channel import Channel, RpcError
from ._errors import translate

__all__ = ["purge"]


async def purge(channel: Channel, tags: Sequence[str]) -> bool:
    """One ``PurgeSandboxes`` for every sandbox carrying all of ``tags``; False if the service lacks the call.

    Raises the translated error otherwise; sandboxes the service could not delete are logged."""
    from cwsandbox._proto import sandbox_pb2 as pb

    req = pb.PurgeSandboxesRequest(tags=list(tags), request_id=str(uuid.uuid4()))
    try:
        resp = await channel.unary("PurgeSandboxes", req)
    except RpcError as exc:
        if exc.failure.code.name == "UNIMPLEMENTED":
            return False
        raise translate(exc.failure, "purge sandboxes") from exc.cause
    if resp.failed_sandbox_ids or resp.retryable_failed_sandbox_ids:
        log.warning(
            "coreweave purge left sandboxes",
            failed=list(resp.failed_sandbox_ids),
            retryable=list(resp.retryable_failed_sandbox_ids),
        )
    return True
