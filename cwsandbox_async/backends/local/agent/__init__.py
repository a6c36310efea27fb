"""The sandbox agent: the program that runs inside every local sandbox (stdlib only).

This package is never imported from disk inside a sandbox: the driver sends it
as a bundle of compiled modules (``_protocol.agent_bundle``) and the bootstrap
loads it as the top-level package ``cwsandbox_agent``; every import inside it is
relative. On the driver side it is ``cwsandbox_async.backends.local.agent``,
imported by the tests and for the protocol constants (``protocol``).

Processes inside a sandbox (all the same user; the agent is PID 1)::

    agent (server, scheduler)        reads every request; never forks after that
     |- template (template)          forked before the first request; births workers
     |- worker (worker) ...          clone(CLONE_PARENT) of the template: the agent's child
     |   `- command (child)          posix_spawn of argv, or a fork that runs Python source

Modules: ``main`` (entry points), ``server`` (the loop, frames, files),
``scheduler`` (execs and workers), ``execs`` (their records), ``worker``,
``child``, ``template``, ``proctree`` (process trees, CPU and run-queue wait),
``oom`` (cgroup OOM counts), ``files``, ``harden`` and ``seccomp`` (birth-path
hardening), ``nsroot`` (the ``unshare`` fallback's file system), ``sysapi``
(ctypes calls), ``settings``, ``protocol``.
"""
