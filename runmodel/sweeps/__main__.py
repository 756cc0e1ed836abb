"""``python -m runmodel.sweeps JOB``: one trial's process, started by the sweep."""

import json
import sys

from . import _run_trial

sys.exit(_run_trial(json.loads(sys.argv[1])))
