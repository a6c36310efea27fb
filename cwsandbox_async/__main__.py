"""``python -m cwsandbox_async``: the ``cwsandbox-async`` command line (``cwsandbox_async.cli.main``)."""

import sys

from .cli import main

sys.exit(main())
