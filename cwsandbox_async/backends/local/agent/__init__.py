"""Code that runs inside a local sandbox (stdlib only; imported there as ``cwsandbox_agent``).

The driver binds this directory read-only at ``/run/cwsandbox/cwsandbox_agent`` in every sandbox
(see ``_rootfs``). Modules here may import only the standard library and each other (relatively).
"""
