"""Trainer integrations. Each submodule is imported on its own and needs no trainer package to import.

- ``cwsandbox_async.integrations.trl``: reward functions for TRL's ``GRPOTrainer``
  (async for TRL's async reward path, sync through one persistent loop thread).
- ``cwsandbox_async.integrations.art``: tool schemas, ``execute_tool`` (errors become
  observations), and ``sandbox_rollout`` (lease, own deadline, always release) for
  ART-style multi-step rollouts. ``art`` itself is imported only by the helpers that
  need it.

``import cwsandbox_async`` does not import this package.
"""

from __future__ import annotations

__all__: list[str] = []
