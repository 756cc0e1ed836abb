"""Stochastic weight averaging: the running mean of the module's weights at the end of
each epoch from a given epoch on, with ``SWALR``'s learning rate and ``update_bn``'s
batch-norm statistics (``torch.optim.swa_utils``). The swap of the average in for
evaluation, shared with EMA, is ``weight_averaging.py``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.optim.swa_utils import SWALR, update_bn
from torch.utils.data import DataLoader

from ..core import hook
from ..core.checks import is_number, whole_number
from .weight_averaging import WeightAveraging

__all__ = ["SWA"]

ANNEALING = ("cos", "linear")


class SWA(WeightAveraging):
    """Stochastic weight averaging (Izmailov et al., 2018), as ``torch.optim.swa_utils``
    does it: from epoch ``start`` on (counted from 0), the weights at each epoch's end are
    averaged into ``averaged`` (an ``AveragedModel``: their running mean).

    ``swa_lr`` (a number, or one per param group): from ``start`` on, ``SWALR`` anneals
    each group's learning rate to it over ``anneal_epochs`` epochs (``anneal_strategy``
    ``"cos"`` or ``"linear"``), stepped at each epoch's end after the averaging; None
    leaves the learning rate alone. An ``LRSchedule`` pack in the same run is refused with
    ``swa_lr`` (both would set the rate).

    Batch-norm statistics are not averaged: after each averaging, where the module has
    batch-norm layers, ``update_bn`` recomputes the average's with one pass over the
    training data (in order, without shuffling; the random generators are left as they
    were), so the average is ready wherever it is used: in an evaluation
    (``use_averaged=True``: the run's ``Evaluate`` packs evaluate it), in a checkpoint,
    by ``runmodel eval RUN_DIR --averaged`` and ``runmodel export PATH OUT --averaged``.
    ``update_bn`` feeds each batch's first element (``batch[0]``) to the module, as a
    TorchModel with ``(inputs, target)`` batches does.

    The average, its count and ``SWALR``'s state are in every checkpoint: a resumed run
    continues exactly. Refused under ``fsdp`` (the module's weights are sharded).
    """

    name = "swa"

    def __init__(
        self,
        start: int = 0,
        swa_lr: float | list[float] | None = None,
        anneal_epochs: int = 10,
        anneal_strategy: str = "cos",
        use_averaged: bool = False,
    ) -> None:
        whole_number(start, "SWA(start=)", meaning="the first epoch averaged, from 0")
        rates = swa_lr if isinstance(swa_lr, (list, tuple)) else [swa_lr]
        if swa_lr is not None and not (rates and all(is_number(r, above=0) for r in rates)):
            raise ValueError(
                f"SWA(swa_lr=) is the learning rate to anneal to: a number > 0, "
                f"one per param group, or None (leave the rate alone); got "
                f"{swa_lr!r}"
            )
        whole_number(anneal_epochs, "SWA(anneal_epochs=)")
        if anneal_strategy not in ANNEALING:
            raise ValueError(f"SWA(anneal_strategy=) is 'cos' or 'linear'; got {anneal_strategy!r}")
        super().__init__(use_averaged=use_averaged, use_buffers=False)
        self.start, self.swa_lr = start, swa_lr
        self.anneal_epochs, self.anneal_strategy = anneal_epochs, anneal_strategy
        #: the learning rate's scheduler from ``start`` on (with ``swa_lr``)
        self.scheduler: SWALR | None = None
        self._scheduler_state: dict[str, Any] | None = None
        self._batch_norm = False

    def check_setup(self, engine: Any) -> None:
        super().check_setup(engine)
        if engine.state.mode != "train":
            return
        last = engine.state.max_epochs
        if last is not None and self.start >= last:
            raise ValueError(
                f"SWA(start={self.start}) averages from epoch {self.start} (counted from 0), "
                f"and the run ends after epoch {last - 1} (epochs={last}): nothing would be "
                f"averaged; give SWA a start below {last}, or the run more epochs"
            )
        if self.swa_lr is None:
            return
        from .lr_schedule import LRSchedule

        schedules = [k for k, p in engine.table.packs.items() if isinstance(p, LRSchedule)]
        if schedules:
            raise ValueError(
                f"SWA(swa_lr={self.swa_lr!r}) and the LRSchedule pack "
                f"{schedules[0]!r} would both set the learning rate from epoch "
                f"{self.start} on: give SWA swa_lr=None to keep the schedule, or "
                f"detach the LRSchedule"
            )
        if not isinstance(getattr(engine.model, "optimizer", None), torch.optim.Optimizer):
            raise TypeError(
                f"SWA(swa_lr=) anneals the optimizer's learning rate; "
                f"{type(engine.model).__name__}.optimizer is "
                f"{getattr(engine.model, 'optimizer', None)!r}"
            )

    @hook(modes="train")
    def setup(self, engine: Any) -> None:
        super().setup(engine)
        module = engine.model.module
        self._batch_norm = any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()
        )
        self.scheduler = None
        if self.swa_lr is not None:  # made at the start, as torch's recipe makes it: it
            # leaves the rate alone until its first step, at the end of epoch `start`
            self.scheduler = SWALR(
                engine.model.optimizer,
                swa_lr=self.swa_lr,  # type: ignore[arg-type]
                anneal_epochs=self.anneal_epochs,
                anneal_strategy=self.anneal_strategy,  # type: ignore[arg-type]
            )
            if self._scheduler_state is not None:
                self.scheduler.load_state_dict(self._scheduler_state)
        self._scheduler_state = None

    # before Evaluate (0), so that it sees this epoch's average; after GradAccumulation's
    # last step of the epoch (1000)
    @hook(priority=500, modes="train")
    def epoch_end(self, engine: Any) -> None:
        """From epoch ``start`` on, at the end of each whole epoch: average, recompute the
        average's batch-norm statistics, step ``SWALR``."""
        state = engine.state
        if state.epoch < self.start or not state.epoch_complete:
            return
        self.update(engine)
        if self._batch_norm:
            self._update_bn(engine)
        if self.scheduler is not None:
            self.scheduler.step()

    def _update_bn(self, engine: Any) -> None:
        model = engine.model
        assert self.averaged is not None
        with torch.random.fork_rng(devices=[]):  # a DataLoader's iterator draws a seed
            update_bn(
                (model.to_device(batch) for batch in _in_order(model.train_data)), self.averaged
            )

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        scheduler = (
            self.scheduler.state_dict() if self.scheduler is not None else self._scheduler_state
        )
        if scheduler is not None:
            state["scheduler"] = scheduler
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._scheduler_state = state.get("scheduler")


def _in_order(data: Iterable[Any]) -> Iterator[Any]:
    """The training data's batches in order: a DataLoader's dataset read again without
    its sampler's shuffling (nor its generator's draws), else the batches as they are."""
    if isinstance(data, DataLoader) and data.batch_size is not None:
        yield from DataLoader(
            data.dataset, batch_size=data.batch_size, collate_fn=data.collate_fn, num_workers=0
        )
    else:
        yield from data
