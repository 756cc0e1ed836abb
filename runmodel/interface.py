"""What a step does, as a strategy (seed 001): ``train_step``, ``evaluate``,
``inference``, ``generate``, ``save``.

A model carries its interface in ``model.interface``; a run (or a config) may set
another. ``TorchModel``'s default, ``Supervised``, is what train mode's forward, backward
and optimizer_step phases already do, so with it the engine runs those phases; with any
other interface, a train step's runstep action is ``interface.train_step(model, batch)``
and infer and eval steps call ``interface.inference(model, batch)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

__all__ = ["Interface", "Supervised"]


class Interface:
    """The strategy of a step. Override what your model needs; the rest say so."""

    def train_step(self, model: Any, batch: Any) -> dict[str, Any]:
        """One training step on ``batch``; returns at least ``{"loss": tensor}``."""
        raise NotImplementedError(f"{type(self).__name__} has no train_step")

    def evaluate(self, model: Any, data: Iterable[Any]) -> dict[str, Any]:
        """Metrics over ``data``."""
        raise NotImplementedError(f"{type(self).__name__} has no evaluate")

    def inference(self, model: Any, batch: Any) -> Any:
        """The model's output for ``batch``, without grad."""
        raise NotImplementedError(f"{type(self).__name__} has no inference")

    def generate(self, model: Any, batch: Any) -> Any:
        """Generated output for ``batch`` (sequence models)."""
        raise NotImplementedError(f"{type(self).__name__} has no generate")

    def save(self, model: Any, directory: str | Path) -> Path:
        """Write what it takes to use the model again into ``directory``."""
        raise NotImplementedError(f"{type(self).__name__} has no save")


class Supervised(Interface):
    """Inputs and targets: ``TorchModel``'s own ``compute_output``/``compute_loss``,
    then backward and an optimizer step."""

    def train_step(self, model: Any, batch: Any) -> dict[str, Any]:
        output = model.compute_output(batch)
        loss = model.compute_loss(output, batch)
        loss.backward()
        model.optimizer.step()
        model.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss.detach(), "output": output.detach()}

    def evaluate(self, model: Any, data: Iterable[Any]) -> dict[str, Any]:
        from .modes import evaluate

        return evaluate(model, data)

    def inference(self, model: Any, batch: Any) -> Any:
        with torch.no_grad():
            return model.compute_output(batch)

    def save(self, model: Any, directory: str | Path) -> Path:
        path = Path(directory) / "model.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        from .model import unwrap

        torch.save(unwrap(model.module).state_dict(), path)
        return path


def register_builtins(register: Callable[[str, Any], Any]) -> None:
    register("supervised", Supervised)
