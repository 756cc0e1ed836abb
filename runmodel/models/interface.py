"""What a step does, as a strategy: ``train_step``, ``evaluate``, ``inference``,
``generate``, ``save``.

A model carries its interface in ``model.interface``; a run (or a config) may set
another. ``TorchModel``'s default, ``Supervised``, splits a train step into ``forward``,
``backward`` and ``optimizer_step``, which train mode runs as those three phases (so
hooks and overrides reach each); with an interface whose ``train_step`` is its own, a
train step is ``interface.train_step(model, batch)``, and eval and infer steps call
``interface.inference(model, batch)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write

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

    def output_fn(self, model: Any) -> Callable[[Any], Any]:
        """What an eval or infer step calls on a batch: ``inference``."""
        return lambda batch: self.inference(model, batch)

    @property
    def phased(self) -> bool:
        """Whether a train step runs as the forward, backward and optimizer_step phases
        (``Supervised`` and subclasses that keep its ``train_step``)."""
        return False


class Supervised(Interface):
    """Inputs and targets: the model's ``compute_output`` and ``compute_loss``, then
    backward and an optimizer step. The train step is written here once, in three
    parts; train mode runs each part as its phase's action."""

    def forward(self, model: Any, batch: Any) -> tuple[Any, torch.Tensor]:
        output = model.compute_output(batch)
        return output, model.compute_loss(output, batch)

    def backward(self, model: Any, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self, model: Any) -> None:
        optimizer = model.optimizer  # read each step: a hook may replace it
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def train_step(self, model: Any, batch: Any) -> dict[str, Any]:
        output, loss = self.forward(model, batch)
        self.backward(model, loss)
        self.optimizer_step(model)
        return {"loss": loss.detach(), "output": output.detach()}

    @property
    def phased(self) -> bool:
        return type(self).train_step is Supervised.train_step

    def evaluate(self, model: Any, data: Iterable[Any]) -> dict[str, Any]:
        from .metrics import evaluate

        # a run's final evaluation and `runmodel eval`: the generators as the training left
        # them, for the run's last checkpoint (a longer run resumed from it goes on alike)
        return evaluate(model, data, isolate_rng=True)

    def inference(self, model: Any, batch: Any) -> Any:
        with torch.no_grad():
            return model.compute_output(batch)

    def output_fn(self, model: Any) -> Callable[[Any], Any]:
        return model.compute_output  # called under no_grad already

    def save(self, model: Any, directory: str | Path) -> Path:
        from .torchutil import unwrap

        module = unwrap(model.module)
        if module is None:
            raise ValueError(f"{type(model).__name__} has no module to save")
        path = Path(directory) / "model.pt"
        with atomic_write(path) as file:  # the old file, or the whole new one
            torch.save(module.state_dict(), file)
        return path
