"""The sandbox agent: the program that runs inside every local sandbox (stdlib only).

Inside a sandbox this package is ``cwsandbox_agent``: the template-born sandboxes import it from
the directory the driver binds read-only at ``/run/cwsandbox/cwsandbox_agent`` (see ``_rootfs``);
an unisolated agent (``isolation="none"``) loads it from a bundle of compiled modules the driver
sends (``_runners/host_boot.agent_bundle``). Modules here may import only the standard library and each
other (relatively). On the driver side it is ``cwsandbox_async.backends.local.agent``, imported by
the tests and for the protocol constants (``protocol``).

A sandbox at rest is **one process**, its PID 1 (``init``), which never reads a request's bytes:
the driver writes each request into a memfd, creates the output pipes itself, and passes their
descriptors with a fixed-size order; PID 1 forks once per order, and the child reads its own
request and becomes the command::

    PID 1 (init, execs)              reads orders (numbers and fds); reaps; reports
     |- command (child) ...          execve'd argv, or a fork that runs Python source
     |   `- its processes            all below it: each command is a child subreaper
     |- file helper (child, files)   reads or writes one file for the driver

Modules: ``main`` (entry points), ``init`` (PID 1's loop), ``execs`` (starting, watching, ending
and reporting execs), ``child`` (what a fork becomes), ``files``, ``proctree`` (process trees, CPU
and run-queue wait), ``oom`` (cgroup OOM counts), ``harden`` and ``seccomp`` (birth-path
hardening), ``sysapi`` (ctypes), ``settings``, ``protocol``; ``_rootfs`` and ``_birth`` are the
template that births sandboxes (the driver's side of birth: ``_template``, ``_runners/born``).
"""
