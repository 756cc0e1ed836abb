"""The engine's checkpoint state: what a snapshot holds (counters, the last loss and
metrics, every pack's state, the model's state, the random generators, where the data
stands) and how a run continues from one. How snapshots are written and read is the
run's checkpoint storage (``plan.CheckpointStorage``; ``runmodel.checkpoint``)."""

from __future__ import annotations

import random
import warnings
from typing import TYPE_CHECKING, Any, cast

from .continuing import world_size
from .plan import RunHorizon

if TYPE_CHECKING:
    import os
    from pathlib import Path

    from .loop import Loop
    from .plan import CheckpointStorage, StepPlan
    from .state import State
    from .table import HookTable

__all__ = ["Snapshots", "rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's (CPU and every CUDA device's) random
    number generators, as plain values."""
    import torch  # imported once a run needs it

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),  # Python's 625 words as a tensor:
        "python": (version, torch.tensor(internal), gauss),
    }  # one record
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        name, keys, pos, has_gauss, cached = cast(
            "tuple[str, Any, int, int, float]", numpy.random.get_state()
        )
        state["numpy"] = (name, torch.from_numpy(keys.copy()), pos, has_gauss, cached)
    except ImportError:
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state()`` returned."""
    import torch

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    internal = internal.tolist() if isinstance(internal, torch.Tensor) else internal
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, keys.numpy(), pos, has_gauss, cached))


class Snapshots:
    """The checkpoint half of ``Engine``: ``state_dict``/``load_state_dict`` for the
    engine's own state, ``snapshot``/``restore`` for everything a checkpoint holds."""

    state: State
    table: HookTable
    model: Any
    storage: CheckpointStorage | None
    _loop: Loop | None

    def __init__(self) -> None:
        self._resuming = False  # load_state_dict ran: the next run keeps its counters
        self.announce_resume = False  # say which checkpoint a run resumes from (stderr)
        self._loaded_run: dict[str, Any] | None = None  # a checkpoint's run record
        #: the run this engine runs or ran last: ``{"id": ..., "started": ...}`` (a unix
        #: time), from the checkpoint it resumed from, else made when the run started
        self.run_record: dict[str, Any] = {}
        #: the checkpoint file this run resumed from (None: it started from step 0)
        self.resumed_from: Path | None = None
        #: how a resumed train run goes past the length it was started with, as
        #: ``"epochs 2 -> 4"`` (None: it is no extension); packs whose behaviour depends
        #: on the run's total length refuse it in their ``check_setup``
        self.extension: str | None = None

    def _run_begins(self) -> bool:
        """At a run's start: whether it keeps the counters ``load_state_dict`` gave (a
        resume); what the last run resumed from is forgotten."""
        resuming, self._resuming = self._resuming, False
        if not resuming:
            self._loaded_run = None
        self.resumed_from, self.extension = None, None
        return resuming

    def state_dict(self, counters: dict[str, int] | None = None) -> dict[str, Any]:
        """The run's counters (``counters`` replacing some), the last loss and the
        metrics a file can hold (numbers, strings, tensors), and every pack's state."""
        s = self.state
        return {
            "counters": {
                "step": s.step,
                "epoch": s.epoch,
                "epoch_step": s.epoch_step,
                "skipped": s.skipped,
                # GradAccumulation's shorter windows (state.iteration): only where some were
                **({"window_padding": s.window_padding} if s.window_padding else {}),
                **(counters or {}),
            },
            "loss": _plain(s.loss),
            "metrics": {
                k: v for k, v in ((k, _plain(v)) for k, v in s.metrics.items()) if v is not None
            },
            # the epoch's running sums (its mean loss): only where a train mode keeps some
            **(
                {
                    "epoch_sums": {
                        name: total.state_dict() if hasattr(total, "state_dict") else total
                        for name, total in s.epoch_sums.items()
                    }
                }
                if s.epoch_sums
                else {}
            ),
            "packs": {key: pack.state_dict() for key, pack in self.table.packs.items()},
            # which run this is, and the length it was started or extended to: a
            # resumed run continues the record; an extension is checked against it
            "run": {
                **getattr(self, "run_record", {}),
                "max_epochs": s.max_epochs,
                "max_steps": s.max_steps,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters and pack states; the next run continues these counters."""
        self.state.window_padding = 0  # none saved (or a checkpoint from before): step // k
        for name, value in state.get("counters", {}).items():
            setattr(self.state, name, int(value))
        # what hooks read before the first step (epoch_end right after a checkpoint taken
        # at an epoch's last step; a best-K checkpoint before the next evaluation)
        self.state.loss = state.get("loss")
        self.state.metrics.update(state.get("metrics", {}))
        # the epoch's running sums, for the plan's accumulators to take (none: a checkpoint
        # from before they were kept, whose epoch means count from the resume)
        self.state.epoch_sums = dict(state.get("epoch_sums") or {})
        self._resuming = True
        self._loaded_run = dict(state.get("run") or {})
        for key, pack_state in state.get("packs", {}).items():
            if key in self.table.packs:
                self.table.packs[key].load_state_dict(pack_state)
            elif pack_state:  # a pack without state (a run folder's log) loses nothing
                warnings.warn(
                    f"saved state of pack {key!r} has no attached pack to go to "
                    f"(attached: {sorted(self.table.packs) or 'none'})",
                    stacklevel=2,
                )

    def snapshot(
        self, counters: dict[str, int] | None = None, *, model_state: bool = True
    ) -> dict[str, Any]:
        """Everything a checkpoint holds: the engine's state, the model's, the random
        number generators', where the data stands in the epoch (``position.py``).
        ``counters`` is where a run resumed from it starts. Under a storage that writes
        the model's state itself (``writes_model_state``: the ``fsdp`` backend's, whose
        save reads each process's shards as it writes them), or with ``model_state=False``
        (a background writer that takes it from the live model), the model's part is
        None: no ``state_dict()`` is built that the save would drop."""
        state_dict = getattr(self.model, "state_dict", None)
        if not model_state or (self.storage is not None and self.storage.writes_model_state):
            state_dict = None
        engine = self.state_dict(counters)
        position = {"batches": 0} if self._loop is None else self._loop.position.snapshot(counters)
        if self.epoch_drawn(counters):
            # after the epoch's last batch: its data are all drawn (only its epoch_end
            # hooks are still to run), so it resumes in another number of processes as
            # a checkpoint at the epoch's end does: the data are dealt out anew after it
            engine["run"]["epoch_drawn"] = True
        return {
            "engine": engine,
            "rng": rng_state(),
            "model": state_dict() if callable(state_dict) else None,
            "position": position,
        }

    def counters_now(self) -> dict[str, int] | None:
        """The counters of a checkpoint of the run taken now, from any hook: where a run
        resumed from ``snapshot(counters)`` starts (``Position.now``). None where a
        resumed run has not reached its checkpoint's state yet (its setup hooks, the
        resumed epoch before its first step): the run stands where that checkpoint does.
        A ``RuntimeError`` outside a run."""
        loop = self._loop
        if loop is None:
            raise RuntimeError(
                "no run is under way: a checkpoint holds a running run's state (where its "
                "data stands, its generators); save from one of the run's hooks"
            )
        if self.resumed_from is not None and loop.first_step is None:
            return None  # its setup hooks: the checkpoint's weights are not in place yet
        return loop.position.now(loop.in_step_start)

    def epoch_drawn(self, counters: dict[str, int] | None = None) -> bool:
        """Whether the epoch's data are all drawn at ``counters`` (the counters replacing
        some, as ``snapshot``'s): its last batch has run and only its ``epoch_end`` hooks
        are to come. False outside a run and for data without a length."""
        if self._loop is None:
            return False
        batches = self._loop.position.batches(counters)
        return bool(batches) and batches == self._batches_per_epoch()

    def _batches_per_epoch(self) -> int | None:
        """How many batches an epoch of this process's data has, where it has a length."""
        return RunHorizon.of_model(self.model, self.state.kind, self.state).steps_per_epoch

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue from ``snapshot()``'s result: the next run starts where it was taken."""
        self.load_state_dict(snapshot["engine"])
        self._restore_model(snapshot)

    def _rewind_to(self, checkpoint: str | os.PathLike[str], loop: Loop, plan: StepPlan) -> None:
        """The state of a run resumed from ``checkpoint``, in this run."""
        if self.storage is None:
            raise ValueError("rewind() reads a checkpoint, and this engine has no storage")
        _, saved = self.storage.load(checkpoint, self.model)
        sums = self.state.epoch_sums  # the plan's accumulators take the saved sums
        self.load_state_dict(saved["engine"])
        for name, total in sums.items():
            if hasattr(total, "load_state_dict"):
                total.load_state_dict(self.state.epoch_sums.get(name) or {})
        self.state.epoch_sums = sums
        self._resuming = False
        loop.restart()
        self._restore_model(saved)
        self.table.start(self.state, plan)  # filters count from the checkpoint's counters

    def _restore_model(self, snapshot: dict[str, Any]) -> None:
        model_state = snapshot.get("model")
        if model_state is not None:
            restore_into = getattr(model_state, "restore_into", None)
            if callable(restore_into):  # a sharded checkpoint's: each process reads its shards
                restore_into(self.model)
            else:
                self.model.load_state_dict(model_state)
        if self._loop is None:
            set_rng_state(snapshot["rng"])
        else:  # in a run: the generators are set where the data is (position.py)
            loaded = self._loaded_run or {}
            saved_world = loaded.get("world_size")
            self._loop.position.resume(
                snapshot.get("position", {}),
                snapshot["rng"],
                drawn=bool(loaded.get("epoch_drawn"))
                and (saved_world is not None and int(saved_world) != world_size()),
            )


def _plain(value: Any) -> Any:
    """``value`` if a checkpoint can hold it (a tensor: a copy of its own, so that the
    file holds its bytes alone, not the rest of a storage it is a view of), else None."""
    if isinstance(value, (bool, int, float, str)):
        return value
    detach = getattr(value, "detach", None)  # a tensor; torch is not imported here
    return detach().clone() if callable(detach) else None
