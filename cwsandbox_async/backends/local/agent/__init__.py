"""The sandbox agent: the program that runs inside every local sandbox (stdlib only).

Inside a sandbox this package is ``cwsandbox_agent``: the template-born sandboxes import it from
the directory the driver binds read-only at ``/run/cwsandbox/cwsandbox_agent`` (see ``_rootfs``);
an unisolated agent (``isolation="none"``) loads it from a bundle of compiled modules the driver
sends (``_protocol.agent_bundle``). Modules here may import only the standard library and each
other (relatively). On the driver side it is ``cwsandbox_async.backends.local.agent``, imported by
the tests and for the protocol constants (``protocol``).

Processes inside a sandbox (all the same user; the agent is PID 1)::

    agent (server, scheduler)        reads every request; never forks after that
     |- template (template)          forked before the first request; births workers
     |- worker (worker) ...          clone(CLONE_PARENT) of the template: the agent's child
     |   `- command (child)          posix_spawn of argv, or a fork that runs Python source

Modules: ``main`` (entry points), ``server`` (the loop, frames, files),
``scheduler`` (execs), ``supervisor`` (the template and workers), ``execs``
(their records), ``worker``, ``child``, ``template``, ``proctree`` (process
trees, CPU and run-queue wait), ``oom`` (cgroup OOM counts), ``files``,
``harden`` and ``seccomp`` (birth-path hardening), ``sysapi`` (ctypes calls),
``settings``, ``protocol``; ``_rootfs`` and ``_zygote`` are the zygote that
births sandboxes (the driver's side of birth: ``_template``, ``_born``).
"""
