"""Metrics: the aggregator fed by session, sandbox, pool and gatherer events, and the per-step flush.

``MetricsAggregator`` (``_aggregator``) counts and keeps latency sketches
(``_histogram``); ``MetricsSnapshot`` (``_snapshot``) is the frozen view reporters
read; ``MetricsReporting`` (``_reporting``) numbers the steps and hands snapshots
to the reporters of ``cwsandbox_async.reporters`` (the public place for them).
"""
