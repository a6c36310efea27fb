"""Bulk cleanup: ``PurgeSandboxes`` (one call for every sandbox carrying some tags) and ``sweep``.

The SDK never calls ``PurgeSandboxes``; here it ends a backend (``aclose`` purges the
sandboxes of this backend instance by its creator tag, which also catches a create
whose answer was lost and a delete the service acknowledged without doing) and serves
``sweep`` when it selects exactly the sandboxes to delete. Otherwise (an age filter,
or this backend's own sandboxes to keep) ``sweep`` deletes one by one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..._errors import SandboxValidationError
from ..._log import log
from ..._validate import validate_tags, validate_timeout
from .._shared import destroy_each
from ._channel import Channel, RpcError
from ._convert import MANAGED_TAG
from ._errors import translate

if TYPE_CHECKING:
    from ._backend import CoreWeaveBackend

__all__ = ["purge", "sweep"]


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


async def sweep(
    backend: CoreWeaveBackend, tags: Sequence[str], *, older_than_seconds: float | None, include_own: bool
) -> list[str]:
    """See ``CoreWeaveBackend.sweep``. A sandbox that cannot be deleted is logged and left out of the result."""
    wanted = validate_tags(tags)
    min_age = validate_timeout(older_than_seconds, "older_than_seconds", allow_none=True)
    if not wanted and min_age is None:
        raise SandboxValidationError("sweep needs tags or older_than_seconds, so it cannot delete everything")
    now = time.time()
    infos = await backend.list(wanted)
    victims = [
        i.sandbox_id
        for i in infos
        if (include_own or not backend.owns(i.sandbox_id)) and (min_age is None or now - i.created_at >= min_age)
    ]
    channel = backend.channel
    if (
        victims
        and len(victims) == len(infos)
        and channel is not None
        and await purge(channel, [MANAGED_TAG, *backend.scope, *wanted])
    ):
        for v in victims:
            backend.forget(v)
        log.info("coreweave sweep", tags=list(wanted), swept=len(victims), purged=True)
        return victims
    swept = await destroy_each(victims, backend.destroy, "coreweave")
    log.info("coreweave sweep", tags=list(wanted), swept=len(swept))
    return swept
