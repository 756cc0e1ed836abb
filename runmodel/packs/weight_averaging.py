"""What the weight-averaging packs (``EMA``, ``SWA``) share: an average of the module's
weights kept in a ``torch.optim.swa_utils.AveragedModel``, checkpointed with the run,
and put in the module's place while the run's ``Evaluate`` packs evaluate."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from ..checkpoint.export import AVERAGED
from ..core import Pack, hook
from ..models import TorchModel
from ..models.torchutil import unwrap

__all__ = ["WeightAveraging"]


class WeightAveraging(Pack):
    """The averaged copy of the module (``averaged``, an ``AveragedModel``, made when a
    train run starts), its state in checkpoints, and ``use_averaged``: the averaged
    weights stand in for the module's while an ``Evaluate`` pack of the run evaluates
    (so its ``eval_*`` metrics, and ``Checkpoint(best=)`` ranking by them, are the
    averaged weights'): between the ``eval_start`` and ``eval_end`` phases that every
    evaluation pass of the run fires. A subclass says when the average is updated."""

    #: the AveragedModel's ``multi_avg_fn`` (None: the running mean, SWA's)
    multi_avg_fn: Callable[..., Any] | None = None
    repeatable = False  # two averages would both stand in for the module at evaluation

    def __init__(self, *, use_averaged: bool, use_buffers: bool) -> None:
        if not isinstance(use_averaged, bool):
            raise TypeError(
                f"{type(self).__name__}(use_averaged=) takes True (evaluate the "
                f"averaged weights) or False; got {use_averaged!r}"
            )
        self.use_averaged, self.use_buffers = use_averaged, use_buffers
        #: the average, from the run's setup on (None before)
        self.averaged: AveragedModel | None = None
        self._pending: dict[str, Any] | None = None  # a checkpoint's, until the run starts
        # the module's tensors and the average's, pairwise: kept after the run, so that
        # averaged_weights() works on the trained model
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._swapped = False  # the average stands in the module's place now
        self._averaging = False  # whether anything was averaged in yet (a Python bool:
        # reading n_averaged would sync the device at each evaluation)

    # -- the run --------------------------------------------------------------------------

    def check_setup(self, engine: Any) -> None:
        """A train run of a TorchModel with a module, not sharded by ``fsdp``."""
        if engine.state.mode != "train":
            return
        owner, model = type(self).__name__, engine.model
        module = unwrap(model.module) if isinstance(model, TorchModel) else None
        if module is None:
            raise TypeError(
                f"{owner} averages a TorchModel's module weights; "
                f"{type(model).__name__} has no module"
            )
        others = [
            name
            for name, pack in engine.table.packs.items()
            if isinstance(pack, WeightAveraging) and pack is not self and pack.use_averaged
        ]
        if self.use_averaged and others:
            raise ValueError(
                f"{owner} and {others[0]!r} both have use_averaged=True: one average at a "
                f"time can stand in the module's place at an evaluation; set "
                f"use_averaged=True on one of them"
            )
        if _sharded(module):
            raise ValueError(
                f"{owner} is refused under the fsdp backend: the module's parameters are "
                f"sharded (DTensors) and the average would be a whole copy of the model on "
                f"every process, saved in each process's pack state rather than in the "
                f"sharded checkpoint. Use {owner} with the plain or ddp backend"
            )

    @hook(modes="train")
    def setup(self, engine: Any) -> None:
        """Make the average of this run's module (with a checkpoint's state when the
        run resumes), and put it in the module's place around evaluations if asked."""
        module = unwrap(engine.model.module)
        assert module is not None  # check_setup
        self.averaged = AveragedModel(
            module, multi_avg_fn=self.multi_avg_fn, use_buffers=self.use_buffers
        )
        self._averaging = False
        if self._pending is not None:
            self._load(self._pending)
            self._pending = None
        self._pairs = list(zip(_tensors(module), _tensors(self.averaged.module), strict=True))

    @hook(modes="train")
    def eval_start(self, engine: Any) -> None:
        """``use_averaged``: an evaluation of the run (an ``Evaluate`` pack's) sees the
        averaged weights in the module's place."""
        if self.use_averaged and self._averaging and not self._swapped:
            self._swap()
            self._swapped = True

    @hook(modes="train")
    def eval_end(self, engine: Any) -> None:
        if self._swapped:
            self._swap()
            self._swapped = False

    @hook(modes="train")
    def teardown(self, engine: Any) -> None:
        self.eval_end(engine)  # an evaluation that failed half-way: the module's own back

    def update(self, engine: Any) -> None:
        """Average the module's weights in now."""
        module = unwrap(engine.model.module)
        assert self.averaged is not None and module is not None
        self.averaged.update_parameters(module)
        self._averaging = True

    @contextlib.contextmanager
    def averaged_weights(self) -> Iterator[None]:
        """Within it, the module holds the averaged weights (and buffers); its own are
        back after. The tensors' storages are swapped, nothing is copied; the optimizer
        must not step inside. Before anything was averaged in (SWA before its ``start``),
        the module keeps its own weights."""
        if not self._averaging:
            yield
            return
        self._swap()
        try:
            yield
        finally:
            self._swap()

    def _swap(self) -> None:
        for mine, averaged in self._pairs:
            mine.data, averaged.data = averaged.data, mine.data

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if self.averaged is None:
            return dict(self._pending or {})
        return {
            AVERAGED: {k: v.detach().clone() for k, v in self.averaged.module.state_dict().items()},
            "n_averaged": self.averaged.n_averaged.detach().clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending = dict(state) if state else None
        if self.averaged is not None and self._pending is not None:  # mid-run: at once
            self._load(self._pending)
            self._pending = None

    def _load(self, state: dict[str, Any]) -> None:
        assert self.averaged is not None
        if AVERAGED not in state:
            return
        self.averaged.module.load_state_dict(state[AVERAGED])
        self.averaged.n_averaged.copy_(state["n_averaged"])
        self._averaging = int(state["n_averaged"]) > 0


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """The module's parameters and buffers, in a fixed order."""
    return [*module.parameters(), *module.buffers()]


def _sharded(module: nn.Module) -> bool:
    """Whether fsdp sharded the module's parameters (DTensors)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return any(isinstance(p, DTensor) for p in module.parameters())
