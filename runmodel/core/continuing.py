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

__all__ = ["check_length", "check_world", "run_record", "world_size"]


def world_size() -> int:
    """The number of processes of the run under way: the process group's size (a
    distributed backend made it by now), else 1. torch is not imported for it."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def run_record(loaded: dict[str, Any] | None) -> dict[str, Any]:
    """This run's record: a new one, or the checkpoint's (``loaded``), with this part's
    number of processes (a resume checks it). A checkpoint written before runs had
    records counts as one run's: it gets an id."""
    if loaded is None:
        return {"id": uuid.uuid4().hex[:12], "started": time.time(), "world_size": world_size()}
    return {
        "id": loaded.get("id") or uuid.uuid4().hex[:12],
        "started": loaded.get("started"),
        "world_size": world_size(),
    }


def check_world(s: State, loaded: dict[str, Any], resumed_from: Path | None) -> None:
    """A resume in another number of processes than wrote the checkpoint: say in one line
    what carries over and what differs (``docs/distributed.md``, "Resuming in another
    number of processes"). A checkpoint taken mid-epoch continues the epoch's rest, dealt
    out anew over this run's processes, only where the run that wrote it had its data
    dealt out by a distributed backend (its record's ``data`` is ``"dealt"``: what its
    processes drew is a prefix of the epoch's order) and this run has a process group
    (its backend deals the rest out; it refuses data it cannot deal); else it is refused."""
    saved, world = loaded.get("world_size"), world_size()
    if saved is None or int(saved) == world:  # unrecorded: a checkpoint from before
        return
    saved = int(saved)
    where = f" {resumed_from}" if resumed_from else ""
    drawn = bool(loaded.get("epoch_drawn"))  # after the epoch's last batch: a boundary
    middle = s.epoch_step > 0 and not drawn
    if middle and (loaded.get("data") != "dealt" or not _grouped()):
        why = (
            "this run has no distributed backend (ddp, fsdp) to deal the rest out"
            if loaded.get("data") == "dealt"
            else f"the training data of the run that wrote it were "
            f"{loaded.get('data') or 'not dealt out by a ddp or fsdp backend'}"
        )
        raise ValueError(
            f"the checkpoint{where} was written by {saved} process(es) in the "
            f"middle of epoch {s.epoch + 1} (after {s.epoch_step} steps), and "
            f"this run has {world}: the rest of an epoch is dealt out anew over "
            f"another number of processes only for training data that a ddp or "
            f"fsdp backend dealt out (a DataLoader it made again, a list of "
            f"batches), in a run with one of them, and {why}. Resume in {saved} "
            f"process(es), or from a checkpoint taken at an epoch's end "
            f"(Checkpoint(every='1ep'))"
        )
    if s.rank == 0:
        rng = (
            f"each takes the generators of saved rank (its rank mod {saved})"
            if loaded.get("sharded")
            else "each takes saved rank 0's generators"
        )
        data = (
            f"what the {saved} processes had not drawn of epoch {s.epoch + 1} is dealt out "
            f"over {world} (the epoch trains on the samples a {saved}-process run's "
            f"does, apart from padding), then from epoch {s.epoch + 2} on"
            if middle
            else f"from epoch {s.epoch + (2 if drawn else 1)} on"
        )
        print(
            f"runmodel: resuming in {world} process(es) a checkpoint written by {saved}: "
            f"weights and optimizer state carry over exactly; {data} the training data "
            f"are dealt out over {world}, so the batches (and a step's batch size overall) "
            f"differ from a {saved}-process run's; random generators: {rng}",
            file=sys.stderr,
            flush=True,
        )


def _grouped() -> bool:
    """Whether a process group exists (a distributed backend made it, or the script)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def check_length(
    s: State, budget: float, max_epochs: float, planned: dict[str, Any], resumed_from: Path | None
) -> str | None:
    """Refuse a continued run asked for less than it did; say so in one line when it has
    nothing left to do; return how it extends the length it was started with
    (``"epochs 2 -> 4"``), or None."""
    where = f" (resumed from {resumed_from})" if resumed_from else ""
    if s.max_steps is not None and s.max_steps < s.step:
        raise ValueError(
            f"steps={s.max_steps}, but the run did {s.step} steps already"
            f"{where}; ask for {s.step} or more (steps count from the run's "
            f"start)"
        )
    if s.max_epochs is not None and (
        s.max_epochs < s.epoch or (s.max_epochs == s.epoch and s.epoch_step > 0)
    ):
        done = f"{s.epoch} epochs" + (f" and {s.epoch_step} steps" if s.epoch_step else "")
        raise ValueError(
            f"epochs={s.max_epochs}, but the run did {done} already{where}; "
            f"ask for {s.epoch + (1 if s.epoch_step else 0)} or more (epochs "
            f"count from the run's start)"
        )
    if s.step >= budget or (s.epoch >= max_epochs and s.epoch_step == 0):
        print(
            f"runmodel: the run{where} has done its {s.epoch} epochs ({s.step} steps) "
            f"already: nothing to train; ask for more epochs or steps to extend it",
            file=sys.stderr,
            flush=True,
        )
        return None
    longer = [
        f"{unit} {planned.get(key)} -> {asked}"
        for unit, key, asked in (
            ("epochs", "max_epochs", s.max_epochs),
            ("steps", "max_steps", s.max_steps),
        )
        if planned.get(key) is not None and (asked is None or asked > planned[key])
    ]
    return ", ".join(longer) or None
