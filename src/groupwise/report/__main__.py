"""``python -m groupwise.report RUN_DIR [RUN_DIR ...]``, the same as ``groupwise report``."""

import sys

from . import main

sys.exit(main())
