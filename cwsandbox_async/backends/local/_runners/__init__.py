"""The ways a local sandbox runs, one class each, all behind one interface (``base.Runner``).

- ``born``: born from the template, in fresh namespaces (the default);
- ``plain``: no process between execs, each exec its own bwrap;
- ``host``: no isolation (``isolation="none"``), the agent a process of this user on the host
  (``host_boot``: what it is sent at its boot).
"""
