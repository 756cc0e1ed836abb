"""A pack written once and used by two scripts here (``line_fit.py``, ``blobs_tensorboard.py``):
it watches the gradient's global norm, and can stop a run whose gradient has vanished.

    from grad_norm import GradNorm          # a script in this folder imports it by name
    engine.attach(GradNorm(every=1, stop_below=1e-3))

Every ``every`` train steps it measures the norm of all the module's gradients (right
after ``backward``, before the optimizer step), adding it up on the device: no ``.item()``
and no device sync per step. At each epoch's end it puts the epoch's mean into
``state.metrics["grad_norm"]`` (so ``Progress``, ``TensorBoard`` and the result show it),
and, with ``stop_below=``, stops the run once that mean falls below it, saying why in
``result.reason``. Its history of epoch means is saved in checkpoints. (The built-in
``GradClip`` pack reports the same mean under the same name while it clips: use this one
where nothing clips, or to stop.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

import runmodel


class GradNorm(runmodel.Pack):
    name = "grad_norm"

    def __init__(self, every: int = 1, stop_below: float | None = None) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"GradNorm(every=) is a whole number of steps >= 1, got {every!r}")
        if stop_below is not None and not stop_below > 0:
            raise ValueError(f"GradNorm(stop_below=) is a norm > 0 or None, got {stop_below!r}")
        self.every, self.stop_below = every, stop_below
        self.history: list[float] = []  # the mean norm of each epoch
        self._params: list[torch.nn.Parameter] = []
        self._total: torch.Tensor | None = None
        self._count = 0

    def hooks(self) -> Iterator[runmodel.Hook]:
        # hooks depend on `every`, so they are listed here rather than by method names
        options = runmodel.HookOptions.of
        yield runmodel.Hook(self.setup, "setup", options(name="grad_norm.setup",
                                                         modes={"train"}))
        yield runmodel.Hook(self.measure, "backward", options(
            every=self.every, name="grad_norm.measure", modes={"train"}))
        # before TensorBoard (-100), EarlyStopping (-200), Progress (-300), Checkpoint
        yield runmodel.Hook(self.report, "epoch_end", options(
            priority=-20, name="grad_norm.report", modes={"train"}))

    def setup(self, engine: runmodel.Engine) -> None:
        module = getattr(engine.model, "module", None)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"GradNorm needs a model with a torch module; "
                            f"{type(engine.model).__name__} has none")
        self._params = list(module.parameters())  # once, not per step
        self._total, self._count = None, 0

    def measure(self, engine: runmodel.Engine) -> None:
        grads = [p.grad for p in self._params if p.grad is not None]
        if grads:
            norm = torch.nn.utils.get_total_norm(grads)
            self._total = norm if self._total is None else self._total + norm
            self._count += 1

    def report(self, engine: runmodel.Engine) -> None:
        if self._total is None:
            return
        mean = (self._total / self._count).item()  # once an epoch
        self._total, self._count = None, 0
        self.history.append(mean)
        engine.state.metrics["grad_norm"] = mean
        if self.stop_below is not None and mean < self.stop_below:
            engine.stop(f"grad_norm: the epoch's mean gradient norm {mean:.2e} fell below "
                        f"{self.stop_below:g}")

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = list(state["history"])
