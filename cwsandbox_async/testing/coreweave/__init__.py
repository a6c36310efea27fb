"""A CoreWeave Sandbox service for tests: the real gRPC protocol on 127.0.0.1, real local sandboxes.

Test reward code against the protocol offline, in your own CI::

    python -m cwsandbox_async.testing.coreweave            # prints http://127.0.0.1:PORT; Ctrl-C stops it
    CWSANDBOX_BASE_URL=http://127.0.0.1:PORT CWSANDBOX_API_KEY=test python my_reward.py

or in-process (``async with CoreWeaveTestServer() as server: ... server.url``). It serves the
RPCs the ``cwsandbox`` SDK 1.22 calls (``rpcs="all"`` adds unary ``Exec`` and
``PurgeSandboxes``), records every request (``server.service.requests``) and injects
faults (``server.service.faults``, see ``Faults``). Needs the ``coreweave`` extra and a
machine where the local backend runs (bubblewrap). It proves protocol use, not the
service's behaviour (state timing, limits, pagination, mTLS).
"""

from __future__ import annotations

from ...backends import coreweave as _coreweave  # noqa: F401 - first: grpc's fork setting (see there)
from ._faults import Abort, Faults
from ._server import ALL_RPCS, SDK_RPCS, CoreWeaveTestServer, SandboxService

__all__ = ["ALL_RPCS", "SDK_RPCS", "Abort", "CoreWeaveTestServer", "Faults", "SandboxService"]
