"""``python -m runmodel`` is the ``runmodel`` command."""

import sys

from .cli import main

sys.exit(main())
