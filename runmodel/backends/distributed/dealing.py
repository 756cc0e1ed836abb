"""``Dealer``: the ``ddp`` and ``fsdp`` backends' data during a run. It deals the model's
data out to the processes (``data.py``) and puts them back after, calls ``set_epoch`` at
each epoch's start, and keeps where the epoch under way stands, so that a checkpoint
taken in the middle of an epoch can be resumed in another number of processes: the rest
of the epoch dealt out anew (``data.deal_rest``). The backend's pack (``ddp.py``,
``DistributedRun``) calls it from its hooks; the run's distributed lifecycle (the stop
check, the end agreement, failures) is the pack's own."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DistributedSampler

from . import env
from .data import Chain, DealingSampler, DealtBatches, shard_eval_data, shard_train_data

__all__ = ["Dealer", "shared_seed"]


class Dealer:
    """The data of one distributed run of ``model``; ``backend`` (``"ddp"``) names the
    backend in errors."""

    def __init__(self, model: Any, backend: str) -> None:
        self.model, self.backend = model, backend
        self.sampler: DistributedSampler[Any] | None = None
        self.data: dict[str, Any] = {}  # attribute -> the model's own data, put back after
        # the training data this backend dealt out (None: dealt otherwise, or not at all),
        # and what one item of it is, in batches: the loader's batch size (1 for a list)
        self.dealt: DealingSampler | DealtBatches | None = None
        self.unit = 1
        # where the epoch under way stands: its number, the skipped batches before it, and
        # the parts of it that ran in another number of processes (data.Chain)
        self.epoch, self.skipped_before = -1, 0
        self.chain: Chain = []
        self.loaded: dict[str, Any] | None = None  # the checkpoint's state of the pack
        self.first_epoch = True

    def shard(self, seed: int | None) -> None:
        """Deal the model's training and eval data out to the processes; ``seed`` is the
        training sampler's (None: ``shared_seed(generator)`` draws one for all)."""
        model, rank, world = self.model, env.rank(), env.world_size()
        train = getattr(model, "train_data", None)
        if train is not None:
            if seed is None:
                seed = shared_seed(getattr(train, "generator", None))
            sharded = shard_train_data(train, rank, world, seed)
            self.data["train_data"] = train
            model.train_data = sharded
            sampler = getattr(sharded, "sampler", None)
            self.sampler = sampler if isinstance(sampler, DistributedSampler) else None
            if isinstance(sampler, DealingSampler):
                self.dealt, self.unit = sampler, sharded.batch_size or 1
            elif isinstance(sharded, DealtBatches):
                self.dealt = sharded
        for name in ("eval_data",):
            data = getattr(model, name, None)
            if data is not None:
                self.data[name] = data
                setattr(model, name, shard_eval_data(data, rank, world))

    def drawn(self, state: Any) -> int:
        """How many batches of the epoch under way this process had drawn when the
        checkpoint this run resumes from was taken (0: it resumes at an epoch's start)."""
        loaded = self.loaded
        if loaded is None or loaded.get("epoch") != state.epoch:
            return 0
        return max(0, state.epoch_step + state.skipped - int(loaded.get("skipped_before", 0)))

    def check_setup(self, engine: Any) -> None:
        """A run resumed in the middle of an epoch begun in another number of processes
        deals the epoch's rest out anew: only data this backend dealt out can be."""
        s, loaded = engine.state, self.loaded
        if s.mode != "train" or loaded is None or loaded.get("world") is None:
            return
        drawn, saved = self.drawn(s), int(loaded["world"])
        if not drawn or (saved == env.world_size() and not loaded.get("chain")):
            return
        if loaded.get("epoch_batches") is not None and drawn >= int(loaded["epoch_batches"]):
            return  # the epoch's data were all drawn: it resumes as at the epoch's end
        why = self.why_not_dealt()
        if why is None and loaded.get("dealt") not in (None, self.dealt_kind()):
            why = f"{self.dealt_kind()}, and the checkpoint's were {loaded['dealt']}"
        if why is None:
            return
        raise ValueError(
            f"the checkpoint {engine.resumed_from} was written by {saved} process(es) in the "
            f"middle of epoch {s.epoch + 1} (after {drawn} of its batches), and this run has "
            f"{env.world_size()}: the rest of the epoch is dealt out anew only for training "
            f"data the {self.backend} backend deals out itself (a DataLoader it makes again, "
            f"a list of batches), and this run's are {why}. Resume in {saved} process(es), "
            f"or from a checkpoint taken at an epoch's end (Checkpoint(every='1ep'))"
        )

    def dealt_kind(self) -> str:
        return "a list of batches" if isinstance(self.dealt, DealtBatches) else "a DataLoader"

    def why_not_dealt(self) -> str | None:
        """None when this backend dealt the training data out; else what they are."""
        if self.dealt is not None:
            return None
        data = getattr(self.model, "train_data", None)
        if "train_data" not in self.data:
            return "read by each process as it is (DDP(shard_data=False))"
        if self.sampler is not None:
            loader = type(data).__name__
            return f"dealt out by the script's own DistributedSampler (in a {loader})"
        return f"of a type it cannot deal out ({type(data).__name__})"

    def setup(self, engine: Any) -> None:
        """At setup: the run record says whether the run's data are this backend's to
        deal out (a resume in another number of processes checks it); a run resumed in
        the middle of an epoch that began in another number of processes (or went on in
        one) draws the rest of it, dealt out anew."""
        s = engine.state
        why = self.why_not_dealt()
        engine.run_record["data"] = "dealt" if why is None else why
        drawn, loaded = self.drawn(s), self.loaded
        self.chain = []
        if not drawn or self.dealt is None or loaded is None or loaded.get("world") is None:
            return
        saved, chain = int(loaded["world"]), [list(part) for part in loaded.get("chain") or []]
        if saved == env.world_size() and not chain:
            return  # the epoch goes on as it began: the resume skips the drawn batches
        count = drawn * self.unit - sum(part[1] for part in chain)
        if count > 0:
            chain.append([saved, count])
        if isinstance(self.dealt, DealingSampler):
            self.dealt.set_epoch(s.epoch)
        self.dealt.deal(chain)
        self.chain = chain

    def epoch_start(self, engine: Any) -> None:
        s = engine.state
        if self.sampler is not None:
            self.sampler.set_epoch(s.epoch)
        if self.first_epoch:  # maybe resumed in its middle: count its skips as they were
            self.first_epoch = False
            self.skipped_before = s.skipped - max(0, self.drawn(s) - s.epoch_step)
        else:
            self.chain, self.skipped_before = [], s.skipped
            if isinstance(self.dealt, DealtBatches):
                self.dealt.dealt_as_ever()
        self.epoch = s.epoch

    def restore(self) -> None:
        """The model's own data back."""
        for name, data in self.data.items():
            setattr(self.model, name, data)
        self.data = {}

    def state_dict(self) -> dict[str, Any]:
        """The sampler's seed, and where the epoch under way stands: the number of
        processes, the skipped batches before it, its parts in other numbers of
        processes, what the data are and how many batches the epoch has here."""
        try:
            batches: int | None = len(self.model.train_data)
        except TypeError:
            batches = None
        state: dict[str, Any] = {
            "world": env.world_size(),
            "epoch": self.epoch,
            "skipped_before": self.skipped_before,
            "chain": [list(part) for part in self.chain],
            "epoch_batches": batches,
            "dealt": None if self.dealt is None else self.dealt_kind(),
        }
        if self.sampler is not None:
            state["seed"] = int(self.sampler.seed)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = dict(state)
        # a resumed run shuffles as the run it continues, epoch by epoch
        if self.sampler is not None and "seed" in state:
            self.sampler.seed = int(state["seed"])


def shared_seed(generator: torch.Generator | None) -> int:
    """One seed for every process: each draws one (from ``generator``, or torch's), so
    that their generators stay alike; process 0's is given to all."""
    drawn = int(torch.randint(0, 2**62, (), dtype=torch.int64, generator=generator))
    return int(env.broadcast_from_0(drawn))
