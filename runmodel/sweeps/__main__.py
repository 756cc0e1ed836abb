"""``python -m runmodel.sweeps [--torchrun N] JOB``: one trial's process, started by the
sweep."""

import sys

from .trial import process

sys.exit(process(sys.argv[1:]))
