"""The model contract (seed 000) and a ready wrapper for ``torch.nn.Module``s."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .engine import RunStep

__all__ = ["Model", "TorchModel"]


class Model(abc.ABC):
    """What the engine runs. ``__init__`` builds the static model cheaply, ``setup``
    prepares everything a run needs, ``run`` is the model's own loop, which calls the
    ``runstep`` it is handed once per step, and ``teardown`` cleans up; the engine calls
    ``teardown`` whenever it called ``setup``.
    """

    def __init__(self, device: str | None = None,
                 init_options: dict[str, Any] | None = None) -> None:
        self.device = device
        self.init_options: dict[str, Any] = dict(init_options or {})

    def model(self) -> Any:
        """The native network; cheap, and valid without ``setup()``."""
        return None

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        """Prepare for running: data, optimizer, anything not needed to describe the model."""

    @abc.abstractmethod
    def run(self, runstep: RunStep, steps: int | None = None, *args: Any, **kwargs: Any) -> None:
        """The model's loop: call ``runstep(batch)`` once per step, inside
        ``for epoch in runstep.epochs():`` to mark epochs. The engine stops the loop once
        ``steps`` steps ran, even if it never counts them."""

    def step(self, batch: Any) -> Any:
        """What one step does for a model that is not a ``TorchModel``; its return value
        becomes ``engine.state.output``."""
        raise NotImplementedError(f"{type(self).__name__} must define step(batch) to say what "
                                  f"one runstep does (or derive from runmodel.TorchModel)")

    def teardown(self) -> None:
        """Clean up after a run."""


class TorchModel(Model):
    """A ``Model`` for ``torch.nn.Module``s: set ``module`` in ``__init__`` and
    ``optimizer``, ``loss_fn``, ``train_data`` (and ``eval_data``) in ``setup``.

    A step's parts are methods a subclass may override: ``compute_output(batch)`` and
    ``compute_loss(output, batch)``. By default a batch is ``(inputs, target)``.
    """

    module: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    loss_fn: Callable[..., torch.Tensor] | None = None
    train_data: Iterable[Any] | None = None
    eval_data: Iterable[Any] | None = None

    def __init__(self, device: str | None = None,
                 init_options: dict[str, Any] | None = None) -> None:
        super().__init__(device, init_options)
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def model(self) -> torch.nn.Module | None:
        return self.module

    def run(self, runstep: RunStep, steps: int | None = None, *args: Any, **kwargs: Any) -> None:
        data = self.train_data if runstep.mode == "train" else self.eval_data
        if data is None:
            raise ValueError(f"{type(self).__name__} has no "
                             f"{'train_data' if runstep.mode == 'train' else 'eval_data'}; "
                             f"set it in setup()")
        for _ in runstep.epochs():
            for batch in data:
                runstep(batch)

    def compute_output(self, batch: Any) -> Any:
        """The module's output for a batch; by default ``module(batch[0])``."""
        return self.module(batch[0])

    def compute_loss(self, output: Any, batch: Any) -> torch.Tensor:
        """The loss of ``output``; by default ``loss_fn(output, batch[1])``."""
        return self.loss_fn(output, batch[1])
