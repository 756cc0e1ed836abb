"""The backend contract and the plain backend."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..core import CheckpointStorage, Pack, RunHorizon

__all__ = ["Backend", "OptimizerFactory", "Plain"]

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


class Backend:
    """Prepares model and optimizer for a run, after ``model.setup()`` and before the
    ``setup`` hooks. ``optimizer``, a factory called with the module's parameters (a
    torch optimizer class, a ``functools.partial`` of one; a config names it), replaces
    the optimizer the model made; ``pack()`` is attached for the run, for backends that
    change steps."""

    def __init__(self, optimizer: OptimizerFactory | None = None) -> None:
        if optimizer is not None and not callable(optimizer):
            raise TypeError(
                f"optimizer= takes a factory called with the parameters (such as "
                f"torch.optim.SGD or functools.partial(torch.optim.Adam, lr=1e-3)), "
                f"got {optimizer!r}; a config names optimizers by their "
                f"registered name"
            )
        self.optimizer = optimizer

    def initialize(self, model: Any, spec: RunHorizon) -> None:
        if self.optimizer is not None:
            module = getattr(model, "module", None)
            if module is None:
                raise ValueError(
                    f"an optimizer for the backend needs "
                    f"{type(model).__name__}.module to take parameters from"
                )
            # a config's optimizer is built over the module (param groups by name)
            for_module = getattr(self.optimizer, "for_module", None)
            model.optimizer = (
                for_module(module)
                if for_module is not None
                else self.optimizer(module.parameters())
            )

    def pack(self) -> Pack | None:
        """Hooks and overrides this backend needs during the run, if any."""
        return None

    def storage(self) -> CheckpointStorage | None:
        """How this run's checkpoints are written and read, for a backend that shards the
        model (``fsdp``); None: the engine's own, plain files."""
        return None


class Plain(Backend):
    """The model as it is (and the backend's optimizer, if any)."""
