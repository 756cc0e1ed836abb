"""The backend contract, the fine-tune spec it is given, and the plain backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..pack import Pack
from ..registry import Spec, make_optimizer

__all__ = ["Backend", "FineTuneSpec", "Plain"]


@dataclass(frozen=True)
class FineTuneSpec:
    """The run's horizon, so that schedules know it: epochs and steps in all (``None``
    where unknown), steps per epoch and batch size of the training data (when it has a
    ``len`` and a ``batch_size``)."""

    total_epochs: int | None
    total_steps: int | None
    steps_per_epoch: int | None
    batch_size: int | None

    @classmethod
    def of(cls, data: Any, steps: int | None, epochs: int | None) -> FineTuneSpec:
        try:
            per_epoch: int | None = len(data)
        except TypeError:
            per_epoch = None
        total = steps
        if total is None and epochs is not None and per_epoch is not None:
            total = epochs * per_epoch
        return cls(epochs, total, per_epoch, getattr(data, "batch_size", None))


class Backend:
    """Prepares model and optimizer for a run, after ``model.setup()`` and before the
    ``setup`` hooks. ``optimizer`` (a registered optimizer's spec) replaces the one the
    model made; ``pack()`` is attached for the run, for backends that change steps."""

    def __init__(self, optimizer: Spec | str | dict[str, Any] | None = None) -> None:
        self.optimizer = None if optimizer is None else Spec.of(optimizer, "optimizer")

    def initialize(self, model: Any, spec: FineTuneSpec) -> None:
        if self.optimizer is not None:
            module = getattr(model, "module", None)
            if module is None:
                raise ValueError(f"an optimizer spec ({self.optimizer.type_!r}) needs "
                                 f"{type(model).__name__}.module to take parameters from")
            model.optimizer = make_optimizer(self.optimizer, module.parameters())

    def pack(self) -> Pack | None:
        """Hooks and overrides this backend needs during the run, if any."""
        return None


class Plain(Backend):
    """The model as it is (and the configured optimizer, if any)."""
