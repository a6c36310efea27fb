"""The CoreWeave test server now ships in the package (``cwsandbox_async.testing.coreweave``); re-exported here."""

from cwsandbox_async.testing.coreweave import CoreWeaveTestServer, Faults, SandboxService

__all__ = ["CoreWeaveTestServer", "Faults", "SandboxService"]
