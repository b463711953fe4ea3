"""``python -m pushdown``: the ``pushdown`` command line."""

import sys

from ._cli import main

sys.exit(main())
