"""``Session.attach``: a handle to a sandbox another session or process created (``Backend.attach``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ._deadline import backend_call
from ._errors import SandboxError, SandboxValidationError
from ._log import log
from ._sandbox import Sandbox
from ._validate import validate_timeout

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["attach"]


async def attach(session: Session, sandbox_id: str, *, adopt: bool, timeout_seconds: float | None) -> Sandbox:
    """See ``Session.attach``."""
    session._check_open()
    if not isinstance(sandbox_id, str) or not sandbox_id:
        raise SandboxValidationError("sandbox_id must be a non-empty str")
    if sandbox_id in session._sandboxes:
        raise SandboxValidationError(f"sandbox {sandbox_id} is already held by this session")
    timeout = validate_timeout(timeout_seconds, default=session.defaults.operation_timeout_seconds)
    backend = session.backend
    start = time.monotonic()
    with backend_call("attach", timeout, sandbox_id=sandbox_id):
        defaults = await backend.attach(sandbox_id, session.defaults, session_id=session.session_id, adopt=adopt)
    sb = session._handle(sandbox_id, defaults, time.monotonic() - start)
    if adopt:  # stopped with the session's own at its close
        session._sandboxes[sandbox_id] = sb
    log.debug("sandbox attached", sandbox_id=sandbox_id, adopt=adopt, seconds=round(sb.startup_seconds, 4))
    if not session.is_open:  # closed while attaching: let go of it (stopped if adopted)
        if adopt:
            await sb.stop()
        raise SandboxError("session closed while attaching", sandbox_id=sandbox_id, infrastructure=False)
    return sb
