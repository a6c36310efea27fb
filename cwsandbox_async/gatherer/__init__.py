"""The gatherer: run many items of work with bounded concurrency, outcomes as values.

``as_completed`` / ``gather`` (``_gather``) over the workers (``_runner``) and the
lazy input feed (``_feed``); ``Outcome`` and its kinds (``_outcome``);
``gather_groups`` for GRPO groups (``_grpo``); ``wait`` with the CoreWeave SDK's
semantics (``_wait``). The public names are exported by ``cwsandbox_async``.
"""
