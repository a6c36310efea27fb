"""The CoreWeave backend: sandboxes on the CoreWeave Sandbox service, over its gRPC protocol.

Imported only when asked for by name (``load_backend("coreweave", **options)``), so
``import cwsandbox_async`` never imports grpc. Needs the ``coreweave`` extra
(``pip install 'cwsandbox-async[coreweave]'``): the ``cwsandbox`` wheel's generated
protocol modules (pinned to the version this backend speaks) and ``grpcio``. The SDK's
client itself is not used: calls run on the caller's event loop with ``grpc.aio``.
Without the extra, asking for the backend raises ``SandboxBackendUnavailableError``
(and the doctor says what to install).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# grpc's fork handlers are for its sync stack; grpc.aio does not support fork at all. Left on, every
# fork of a process holding a channel (a subprocess, a local sandbox, a data loader) logs "Other
# threads are currently calling into gRPC, skipping fork() handlers" at INFO on stderr, from
# src/core/lib/iomgr/fork_posix.cc. It is read when grpc is imported, so set before; a value the
# user set wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from ._options import CoreWeaveOptions

if TYPE_CHECKING:
    from ._backend import CoreWeaveBackend

__all__ = ["CoreWeaveBackend", "CoreWeaveOptions"]

EXTRA_HINT = "install the coreweave extra: pip install 'cwsandbox-async[coreweave]'"


def __getattr__(name: str) -> Any:
    if name == "CoreWeaveBackend":
        from ..._errors import SandboxBackendUnavailableError

        try:
            from ._backend import CoreWeaveBackend
        except ImportError as exc:  # grpcio or cwsandbox missing
            raise SandboxBackendUnavailableError(
                f"the coreweave backend cannot load ({exc}); {EXTRA_HINT}", infrastructure=False
            ) from exc
        return CoreWeaveBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
