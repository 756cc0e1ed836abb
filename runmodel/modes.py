"""What a step does in each mode: the built-in actions of the action phases.

Each builder returns ``{phase: action}``; the engine wraps each action in that phase's
override chain and reads the chains and hook tuples from ``tables`` on every call, so
hooks added mid-run take effect at the next event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .model import Model, TorchModel

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["build_actions"]

Action = Callable[["Engine"], Any]


def build_actions(mode: str, model: Model, tables: Any) -> dict[str, Action]:
    """The actions of ``mode`` for ``model``; checked before the first step."""
    if isinstance(model, TorchModel):
        if mode == "train":
            return _torch_train(model, tables)
        raise NotImplementedError(f"{mode} mode for TorchModel is not built yet")
    return {"runstep": _model_step(model)}


def _model_step(model: Model) -> Action:
    step = model.step

    def runstep(engine: Engine) -> None:
        state = engine.state
        state.output = step(state.batch)
    return runstep


def _require(model: TorchModel, mode: str, *names: str) -> None:
    missing = [n for n in names if getattr(model, n, None) is None]
    if missing:
        raise ValueError(f"{mode} mode needs {type(model).__name__}."
                         f"{' and .'.join(missing)}; set {'them' if len(missing) > 1 else 'it'} "
                         f"in __init__ (module) or setup() (optimizer, loss_fn, data)")


def _torch_train(model: TorchModel, tables: Any) -> dict[str, Action]:
    _require(model, "train", "module", "optimizer", "loss_fn")
    compute_output, compute_loss, optimizer = (
        model.compute_output, model.compute_loss, model.optimizer)
    model.module.train()

    def forward(engine: Engine) -> None:
        state = engine.state
        state.output = output = compute_output(state.batch)
        state.loss = compute_loss(output, state.batch)

    def backward(engine: Engine) -> None:
        engine.state.loss.backward()

    def optimizer_step(engine: Engine) -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def train_step(engine: Engine) -> None:
        t = tables
        t.forward_action(engine)
        for hook in t.forward:
            hook(engine)
        t.backward_action(engine)
        for hook in t.backward:
            hook(engine)
        t.optimizer_step_action(engine)
        for hook in t.optimizer_step:
            hook(engine)

    return {"runstep": train_step, "forward": forward, "backward": backward,
            "optimizer_step": optimizer_step}
