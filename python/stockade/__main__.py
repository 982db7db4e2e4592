"""``python -m stockade``: the command line."""

import sys

from .cli import main

sys.exit(main())
