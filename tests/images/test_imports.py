"""What importing the image layer costs."""

from __future__ import annotations

import subprocess
import sys


def test_the_package_imports_no_network_code() -> None:
    """A backend looks the cache up (``cached``) on every create: that imports no aiohttp."""
    code = "import sys, cwsandbox_async.images\nprint('aiohttp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"
