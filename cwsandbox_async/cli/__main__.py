"""``python -m cwsandbox_async.cli``."""

import sys

from . import main

sys.exit(main())
