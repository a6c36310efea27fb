"""The CoreWeave backend: sandboxes on the CoreWeave Sandbox service, over its gRPC protocol.

Imported only when asked for by name (``load_backend("coreweave", **options)``), so
``import cwsandbox_async`` never imports grpc. Needs the ``coreweave`` extra
(``pip install 'cwsandbox-async[coreweave]'``): the ``cwsandbox`` wheel's generated
protocol modules (pinned to the version this backend speaks) and ``grpcio``. The SDK's
client itself is not used: calls run on the caller's event loop with ``grpc.aio``.
"""

from __future__ import annotations

from ._backend import CoreWeaveBackend
from ._options import CoreWeaveOptions
from ._probe import ProbeResult, probe

__all__ = ["CoreWeaveBackend", "CoreWeaveOptions", "ProbeResult", "probe"]
