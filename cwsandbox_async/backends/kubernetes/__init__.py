"""The Kubernetes backend: sandboxes as pods, exec over the WebSocket exec subresource.

Imported only when asked for by name (``load_backend("kubernetes", **options)``), so
``import cwsandbox_async`` never imports aiohttp or reads a kubeconfig.
"""

from __future__ import annotations

from ._backend import KubernetesBackend
from ._options import KubernetesOptions

__all__ = ["KubernetesBackend", "KubernetesOptions"]
