"""``wandb_run(model)``: the W&B run an ART model logs to, for ``Session(run=...)``.

ART opens its run with ``reinit="create_new"``, which leaves ``wandb.run`` unset,
so a Session cannot find it alone. And ART logs to W&B only when
``WANDB_API_KEY`` is set, even offline, where no key is needed: left to ART, an
offline run without a key gets nothing, and a Session given ``run=None`` flushes
nowhere. This module makes both cases explicit.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from .._errors import SandboxError
from .._log import log

__all__ = ["wandb_run"]

_OFFLINE = ("offline", "dryrun")
_TRUE = ("1", "true", "yes", "on")


def _setup_error(message: str) -> SandboxError:
    return SandboxError(message, infrastructure=False)


def _mode() -> str:
    if os.environ.get("WANDB_DISABLED", "").lower() in _TRUE:
        return "disabled"
    return os.environ.get("WANDB_MODE", "online").lower()


def wandb_run(model: Any) -> Any:
    """The W&B run for an ART ``model`` (``art.Model`` / ``art.TrainableModel``), or ``None`` if W&B is off.

    - ``None`` when W&B is off for this model: its ``report_metrics`` is a list
      without ``"wandb"``, or ``WANDB_MODE=disabled`` (``WANDB_DISABLED=true``).
    - With ``WANDB_API_KEY`` set: ART's own run (``model._get_wandb_run()``, ART
      0.5), so sandbox metrics land next to ART's.
    - ``WANDB_MODE=offline`` without a key (ART then logs nowhere): a run opened
      the way ART opens it (project, name and id from the model,
      ``resume="allow"``, ``reinit="create_new"``); it holds the sandbox metrics.

    Raises ``SandboxError`` saying what is missing otherwise: wandb is not
    installed, W&B is online without ``WANDB_API_KEY`` (ART would not log; set
    the key, or ``WANDB_MODE=offline``, or give the model ``report_metrics=[]``),
    or the model is not an ART model. What ``wandb.init`` raises propagates.
    These are setup errors: ``infrastructure=False``.
    """
    report = getattr(model, "report_metrics", None)
    mode = _mode()
    if (report is not None and "wandb" not in report) or mode == "disabled":
        return None
    try:
        wandb: Any = importlib.import_module("wandb")
    except ImportError as exc:
        raise _setup_error("wandb_run needs wandb: pip install 'cwsandbox-async[wandb]'") from exc
    if os.environ.get("WANDB_API_KEY"):
        getter = getattr(model, "_get_wandb_run", None)
        if getter is None:
            raise _setup_error(f"{type(model).__name__} has no _get_wandb_run (ART 0.5.x): pass Session(run=...)")
        run = getter()  # what wandb.init raises inside ART propagates as it is
        if run is None:
            raise _setup_error("ART returned no W&B run although WANDB_API_KEY is set")
        return run
    if mode not in _OFFLINE:
        raise _setup_error(
            "ART logs to W&B only when WANDB_API_KEY is set: set it, or WANDB_MODE=offline, "
            "or give the model report_metrics=[] to log nowhere"
        )
    project, name = getattr(model, "project", None), getattr(model, "name", None)
    if not isinstance(project, str) or not isinstance(name, str):
        raise _setup_error(f"wandb_run needs an ART model (with .project and .name), got {type(model).__name__}")
    log.info("opening an offline W&B run for the ART model", project=project, name=name)
    return wandb.init(project=project, name=name, id=name, resume="allow", reinit="create_new")
