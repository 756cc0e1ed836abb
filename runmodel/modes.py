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

__all__ = ["FUSED", "build_actions"]

Action = Callable[["Engine"], Any]

#: Key of an optional runstep action that does the work of the forward, backward and
#: optimizer_step phases in one call; used only while none of them has hooks or overrides.
FUSED = "runstep:fused"


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

    def phased_step(engine: Engine) -> None:
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

    def fused_step(engine: Engine) -> None:
        # phased_step with forward, backward and optimizer_step bare: the same work
        # in one call, which the engine installs while those phases have no hooks.
        state = engine.state
        state.output = output = compute_output(state.batch)
        state.loss = loss = compute_loss(output, state.batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    module, loss_fn = model.module, model.loss_fn

    def fused_default_step(engine: Engine) -> None:
        # fused_step with TorchModel's own compute_output and compute_loss inlined
        state = engine.state
        batch = state.batch
        state.output = output = module(batch[0])
        state.loss = loss = loss_fn(output, batch[1])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    default_parts = (type(model).compute_output is TorchModel.compute_output
                     and type(model).compute_loss is TorchModel.compute_loss)
    return {"runstep": phased_step, "forward": forward, "backward": backward,
            "optimizer_step": optimizer_step,
            FUSED: fused_default_step if default_parts else fused_step}
