"""The suite's hang guards: how long a test waits for a call that must end early before it gives up.

A hang guard is not a timing fact. What the call must not wait out (a ``marker()`` sleep, an endless loop,
a blocked FIFO, a create timeout, a slow reply) is made far longer than the guard (``LONG_SECONDS``) or
lasts forever, so the fact a test asserts is that the call ended at all, inside the guard; at any load it
ends far inside it. One value for every tier, so a change is made once.
"""

#: How long a call that must end early (at its timeout, at a limit, with an error, a refusal, a fault, a
#: death) may take before the test stops waiting.
HANG_GUARD_SECONDS = 120

#: How long what a call must not wait out lasts: far longer than ``HANG_GUARD_SECONDS``.
LONG_SECONDS = 3600

#: ``Timeouts.exec_grace_seconds`` for a test session whose subject is what an exec's end says, not how late
#: the supervisor says it. The client's default grace (``exec_grace_seconds``, 10 s past the exec's own
#: timeout) is a product setting: on an overloaded machine the sandbox's PID 1 reports later than that (its
#: sandbox is one CPU entity among hundreds; seen: 10+ s beside the 256-exec soak and two busy loops), and
#: then the Sandbox layer's deadline, not the report, decides the outcome. Tests of the grace itself set
#: their own.
EXEC_GRACE_SECONDS = HANG_GUARD_SECONDS
