"""Backends, picked by name and imported lazily (``import cwsandbox_async`` imports none of them)."""

from __future__ import annotations

import importlib
from typing import Any

from .._errors import SandboxBackendUnavailableError, SandboxValidationError
from .base import Backend, OutputCallback

__all__ = ["BACKENDS", "Backend", "OutputCallback", "load_backend"]

#: name -> "module:ClassName", imported only when that backend is asked for.
BACKENDS: dict[str, str] = {
    "local": "cwsandbox_async.backends.local:LocalBackend",
    "kubernetes": "cwsandbox_async.backends.kubernetes:KubernetesBackend",
    "coreweave": "cwsandbox_async.backends.coreweave:CoreWeaveBackend",
    "fake": "cwsandbox_async.testing.fake:FakeBackend",
}


def load_backend(backend: str | Backend, **options: Any) -> Backend:
    """Return a backend instance: ``backend`` itself, or a new one of that name built with ``options``."""
    if isinstance(backend, Backend):
        if options:
            raise SandboxValidationError("backend options are only accepted with a backend given by name")
        return backend
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise SandboxValidationError(f"unknown backend {backend!r}; choose one of {', '.join(sorted(BACKENDS))}")
    module_name, _, class_name = BACKENDS[backend].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SandboxBackendUnavailableError(  # an extra not installed: the caller's environment
            f"backend {backend!r} cannot be imported: {exc}", infrastructure=False
        ) from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise SandboxBackendUnavailableError(
            f"backend {backend!r}: {module_name} has no {class_name}", infrastructure=False
        )
    try:
        instance = cls(**options)
    except TypeError as exc:  # an unknown or misspelt option
        raise SandboxValidationError(f"invalid options for backend {backend!r}: {exc}") from None
    assert isinstance(instance, Backend)
    return instance
