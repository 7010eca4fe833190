"""``python -m groupwise.memory ...``: the same as ``groupwise memory ...``; the ``--measure``
children are launched this way (``python -m groupwise.memory --_child SPEC``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
