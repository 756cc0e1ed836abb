"""A run continued from a checkpoint: its record, and the length asked of it.

A run is what starts from step 0 plus every resume and extension of it (``docs/runs.md``):
its record (an id and a start time) goes into every checkpoint it writes, and a resume
carries it on. Asking a continued run for fewer epochs or steps than it did is an error;
as many, with the run finished, trains nothing; more extends it.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .state import State

__all__ = ["check_length", "run_record"]


def run_record(loaded: dict[str, Any] | None) -> dict[str, Any]:
    """This run's record: a new one, or the checkpoint's (``loaded``). A checkpoint
    written before runs had records counts as one run's: it gets an id."""
    if loaded is None:
        return {"id": uuid.uuid4().hex[:12], "started": time.time()}
    return {"id": loaded.get("id") or uuid.uuid4().hex[:12], "started": loaded.get("started")}


def check_length(s: State, budget: float, max_epochs: float, planned: dict[str, Any],
                 resumed_from: Path | None) -> str | None:
    """Refuse a continued run asked for less than it did; say so in one line when it has
    nothing left to do; return how it extends the length it was started with
    (``"epochs 2 -> 4"``), or None."""
    where = f" (resumed from {resumed_from})" if resumed_from else ""
    if s.max_steps is not None and s.max_steps < s.step:
        raise ValueError(f"steps={s.max_steps}, but the run did {s.step} steps already"
                         f"{where}; ask for {s.step} or more (steps count from the run's "
                         f"start)")
    if s.max_epochs is not None and (s.max_epochs < s.epoch or (
            s.max_epochs == s.epoch and s.epoch_step > 0)):
        done = f"{s.epoch} epochs" + (f" and {s.epoch_step} steps" if s.epoch_step else "")
        raise ValueError(f"epochs={s.max_epochs}, but the run did {done} already{where}; "
                         f"ask for {s.epoch + (1 if s.epoch_step else 0)} or more (epochs "
                         f"count from the run's start)")
    if s.step >= budget or (s.epoch >= max_epochs and s.epoch_step == 0):
        print(f"runmodel: the run{where} has done its {s.epoch} epochs ({s.step} steps) "
              f"already: nothing to train; ask for more epochs or steps to extend it",
              file=sys.stderr, flush=True)
        return None
    longer = [f"{unit} {planned.get(key)} -> {asked}"
              for unit, key, asked in (("epochs", "max_epochs", s.max_epochs),
                                       ("steps", "max_steps", s.max_steps))
              if planned.get(key) is not None and (asked is None or asked > planned[key])]
    return ", ".join(longer) or None
