"""``TorchModel``: a ready ``Model`` for ``torch.nn.Module``s, as a subclass or from parts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

from ..checkpoint import check_same_optimizer
from ..checkpoint.format import torch_state, trainable
from .interface import Interface, Supervised
from .model import Model
from .outputs import LABELS, computes_loss, labels_of, output_loss
from .torchutil import torch_device, unwrap

if TYPE_CHECKING:
    from ignite.metrics import Metric

    from ..core import RunStep

__all__ = ["TorchModel", "set_trainable", "state_parts", "trainable"]


class TorchModel(Model):
    """A ``Model`` for ``torch.nn.Module``s: set ``module`` in ``__init__`` and
    ``optimizer``, ``loss_fn``, ``train_data`` (and ``eval_data``) in ``setup``.
    ``test_data``, if set, is a held-out split that a train run with a run folder
    evaluates once after training, with its best (else last) weights, as ``test_*``
    metrics that no pack may read (``docs/runs.md``).

    ``module`` lives on ``self.device``: assigning it moves it there. The parts of a step
    are methods a subclass may override: ``compute_output(batch)``, ``target(batch)``,
    ``compute_loss(output, batch)`` and ``metrics()``; ``interface`` (default
    ``Supervised()``) may be replaced by another ``Interface``. By default a batch is
    ``(inputs, target)``; batches of tensors, tuples, lists and dicts are moved to the
    device by the default loop.

    A batch that is a mapping (``{"input_ids": ..., "attention_mask": ..., "labels":
    ...}``) is the module's keywords, ``module(**batch)``, and its ``labels`` the target:
    a Hugging Face ``transformers`` model trains, evaluates and infers as it is. Without
    ``loss_fn``, the loss is the one the module computes (its output's ``loss``: a
    ``ModelOutput``, or any mapping or object with ``loss``), and metrics are fed its
    ``logits`` (``docs/huggingface.md``).
    """

    interface: Interface = Supervised()
    optimizer: torch.optim.Optimizer | None = None
    loss_fn: Callable[..., torch.Tensor] | None = None
    train_data: Iterable[Any] | None = None
    eval_data: Iterable[Any] | None = None
    infer_data: Iterable[Any] | None = None
    test_data: Iterable[Any] | None = None  # evaluated once, after training (run folders)

    def __init__(
        self, device: str | torch.device | None = None, init_options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(None, init_options)
        self.device = torch_device(device)
        self.module = getattr(self, "_module", None)  # one set before this moves too

    @property
    def module(self) -> nn.Module | None:
        return self._module

    @module.setter
    def module(self, module: nn.Module | None) -> None:
        device = getattr(self, "device", None)
        self._module = module.to(device) if module is not None and device is not None else module

    @classmethod
    def from_parts(
        cls,
        module: nn.Module,
        *,
        optimizer: torch.optim.Optimizer
        | Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
        | None = None,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        train_data: Iterable[Any] | None = None,
        eval_data: Iterable[Any] | None = None,
        infer_data: Iterable[Any] | None = None,
        device: str | torch.device | None = None,
        test_data: Iterable[Any] | None = None,
    ) -> TorchModel:
        """A model from its parts, without writing a subclass: ``optimizer`` is an
        optimizer over ``module``'s parameters, or a factory called with them (as
        ``torch.optim.Adam`` or ``functools.partial(torch.optim.SGD, lr=0.1)``)."""
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"from_parts: module must be a torch.nn.Module, got {type(module).__name__}"
            )
        model = cls(device)
        model.module = module
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            if not callable(optimizer):
                raise TypeError(
                    f"from_parts: optimizer must be a torch.optim.Optimizer or a "
                    f"factory of one, got {optimizer!r}"
                )
            optimizer = optimizer(module.parameters())
        model.optimizer, model.loss_fn = optimizer, loss_fn
        model.train_data, model.eval_data, model.infer_data = train_data, eval_data, infer_data
        model.test_data = test_data
        return model

    def model(self) -> nn.Module | None:
        return self.module

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the model: the module's weights, which of its
        parameters train (``requires_grad``: the trainable set is part of the run's
        state), the optimizer's state (``checkpoint.format.torch_state``)."""
        return torch_state(unwrap(self.module), self.optimizer)

    def check_state_dict(self, state: dict[str, Any]) -> None:
        """Refuse a checkpoint's state whose weights do not fit this model, naming the
        first parameter that differs and both shapes; the engine calls it at setup,
        before any step or hook, when a run resumes."""
        module = unwrap(self.module)
        if state.get("module") is not None and module is not None:
            _check_same_parameters(module, state["module"], type(self).__name__)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s result; weights of another model are refused with
        the parameters that do not match."""
        module, name = unwrap(self.module), type(self).__name__
        if state.get("module") is not None and module is not None:
            _check_same_parameters(module, state["module"], name)
        if state.get("optimizer") is not None and self.optimizer is not None:
            check_same_optimizer(self.optimizer, state, name)  # before anything is loaded
        if state.get("module") is not None and module is not None:
            module.load_state_dict(state["module"])
        if state.get("requires_grad") is not None and module is not None:
            set_trainable(module, state["requires_grad"])
        if state.get("optimizer") is not None and self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    def data_for(self, kind: str) -> Iterable[Any]:
        """The data a step of ``kind`` (``train``, ``eval``, ``infer``) reads."""
        data = {
            "train": self.train_data,
            "eval": self.eval_data,
            "infer": self.infer_data if self.infer_data is not None else self.eval_data,
        }[kind]
        if data is None:
            wanted = {
                "train": "train_data",
                "eval": "eval_data",
                "infer": "infer_data or eval_data",
            }[kind]
            raise ValueError(
                f"{type(self).__name__} has no {wanted} for a {kind} step; set it in setup()"
            )
        return data

    def run(self, runstep: RunStep, steps: int | None = None, *args: Any, **kwargs: Any) -> None:
        data = self.data_for(runstep.kind)
        move = None if self.device.type == "cpu" else self.to_device
        check = None if _step_overridden(runstep) else self._batch_check(runstep.kind)
        for _ in runstep.epochs():
            batches = iter(data)
            for batch in batches:  # the epoch's first batch, checked; then the rest
                if check is not None:
                    check(batch)
                runstep(batch if move is None else move(batch))
                break
            for batch in batches:
                runstep(batch if move is None else move(batch))

    def _batch_check(self, kind: str) -> Callable[[Any], None] | None:
        """What the first batch of each epoch must be for the parts of a step this model
        leaves to ``TorchModel`` (``compute_output`` reads ``batch[0]``, ``target``
        ``batch[1]``); None when it overrides them."""
        interface = self.interface
        if not isinstance(interface, Supervised) or (kind == "train" and not interface.phased):
            return None  # the interface's own step reads the batch
        own_output = not _inherited(self, "compute_output")
        own_target = (
            kind == "infer"
            or not _inherited(self, "target")
            or (kind == "train" and (not _inherited(self, "compute_loss") or self.loss_fn is None))
        )  # the loss reads it (without loss_fn: the module's own loss does not)
        if own_output and own_target:
            return None
        name = type(self).__name__
        size = 1 if own_target else 2

        def check(batch: Any) -> None:
            if isinstance(batch, (tuple, list)) and len(batch) >= size:
                return
            if isinstance(batch, Mapping) and not own_output and (size == 1 or LABELS in batch):
                return  # the module's keywords, and its labels the target
            raise TypeError(
                f"{name}'s {kind} data yields {_batch_text(batch)}, and "
                f"TorchModel expects (input, target) batches: a tuple or list "
                f"whose [0] is the module's input and [1] the target (as a "
                f"DataLoader over a TensorDataset(x, y) yields), or mappings of "
                f"the module's keywords with the target as 'labels'. For batches of "
                f"another form, override {name}.compute_output(batch) (what the "
                f"module is called with) and {name}.target(batch) (what the loss "
                f"and metrics compare the output with)"
            )

        return check

    def to_device(self, batch: Any) -> Any:
        """``batch`` with every tensor in it (through tuples, lists, dicts) on the device."""
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, Mapping):  # a dict, a tokenizer's BatchEncoding
            return {k: self.to_device(v) for k, v in batch.items()}
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
            return type(batch)(*(self.to_device(v) for v in batch))
        if isinstance(batch, (list, tuple)):
            return type(batch)(self.to_device(v) for v in batch)
        return batch

    def compute_output(self, batch: Any) -> Any:
        """The module's output for a batch; by default ``module(batch[0])``, and for a
        mapping batch ``module(**batch)``."""
        # (a try costs nothing until it raises: a tuple batch's step is as it was)
        try:
            inputs = batch[0]
        except KeyError:  # a mapping, whose keys are names: the module's keywords
            return self._module(**batch)  # type: ignore[misc]
        return self._module(inputs)  # type: ignore[misc]  # the property costs a call a step

    def target(self, batch: Any) -> Any:
        """What the output is compared with; by default ``batch[1]``, and a mapping
        batch's ``labels``."""
        try:
            return batch[1]
        except KeyError:
            return labels_of(batch)

    def compute_loss(self, output: Any, batch: Any) -> torch.Tensor:
        """The loss of ``output``; by default ``loss_fn(output, target(batch))``, and
        without ``loss_fn`` the loss the module computed (``output.loss``)."""
        loss_fn = self.loss_fn
        if loss_fn is None:
            return output_loss(output, type(self).__name__)
        return loss_fn(output, self.target(batch))

    def metrics(self) -> dict[str, Metric]:
        """pytorch-ignite metrics that eval mode computes, fed ``(output, target)``.

        By default the loss (with ``loss_fn``, or the one the module computes without
        it; summed in double precision, so that its mean equals a script's ``total +=
        len(batch) * loss.item()`` bit for bit) and, for
        classification losses (cross-entropy, NLL: ``nn.CrossEntropyLoss()`` or
        ``F.cross_entropy``, ``nn.NLLLoss()`` or ``F.nll_loss``), the accuracy;
        accumulated on the model's device so that updating them never synchronises it.
        """
        from ignite.metrics import Accuracy

        from .loss_metric import DoubleLoss, OutputLoss

        found: dict[str, Metric] = {}
        if self.loss_fn is not None:
            found["loss"] = DoubleLoss(self.loss_fn, device=self.device)
        elif _inherited(self, "compute_loss") and computes_loss(unwrap(self.module)):
            found["loss"] = OutputLoss(device=self.device)  # the module's own
        if _classifying(self.loss_fn):
            found["accuracy"] = Accuracy(device=self.device)
        return found


def state_parts(model: Any) -> tuple[nn.Module | None, torch.optim.Optimizer | None] | None:
    """The module and optimizer whose ``checkpoint.format.torch_state`` is ``model``'s
    ``state_dict()``: a ``TorchModel``'s that keeps its class's own ``state_dict`` (a
    background writer takes the state from them, planned once); None for another model,
    whose ``state_dict()`` is its own."""
    if (
        isinstance(model, TorchModel)
        and type(model).state_dict is TorchModel.state_dict
        and "state_dict" not in vars(model)
    ):
        return unwrap(model.module), model.optimizer
    return None


def set_trainable(module: nn.Module, flags: dict[str, bool]) -> None:
    """Give the parameters named in ``flags`` their recorded ``requires_grad``."""
    for name, p in module.named_parameters():
        flag = flags.get(name)
        if flag is not None and p.requires_grad != flag:
            p.requires_grad_(bool(flag))


def _classifying(loss_fn: object) -> bool:
    """Whether ``loss_fn`` is a classification loss, as a module or as the function (also
    in a ``functools.partial``, as ``partial(F.cross_entropy, label_smoothing=0.1)``)."""
    function = getattr(loss_fn, "func", loss_fn)
    return isinstance(loss_fn, (nn.CrossEntropyLoss, nn.NLLLoss)) or any(
        function is f for f in (F.cross_entropy, F.nll_loss)
    )


def _step_overridden(runstep: RunStep) -> bool:
    """Whether an override of ``runstep`` or ``forward`` applies to the run: a step of
    its own, which reads the batch its own way."""
    engine = getattr(runstep, "engine", None)  # a runstep not of an engine: no override
    overrides = getattr(getattr(engine, "table", None), "overrides", {})
    return any(
        o.options.modes is None or runstep.mode in o.options.modes
        for phase in ("runstep", "forward")
        for o in overrides.get(phase, ())
    )


def _inherited(model: TorchModel, name: str) -> bool:
    """Whether ``model.name`` is ``TorchModel``'s own method (not a subclass's, nor a
    function set on the instance)."""
    return getattr(getattr(model, name), "__func__", None) is getattr(TorchModel, name)


def _batch_text(batch: Any) -> str:
    """A batch as an error names it: its type, and a tensor's shape or a dict's keys."""
    if isinstance(batch, torch.Tensor):
        return f"bare tensors (this one of shape {tuple(batch.shape)})"
    if isinstance(batch, dict):
        return f"dicts (this one with keys {', '.join(map(repr, list(batch)[:6]))})"
    if isinstance(batch, (tuple, list)):
        return f"{type(batch).__name__}s of {len(batch)} item{'s' if len(batch) != 1 else ''}"
    return f"{type(batch).__name__} batches"


def _check_same_parameters(module: nn.Module, saved: dict[str, Any], name: str) -> None:
    own = module.state_dict()
    # in the model's order (then the checkpoint's): the first that differs is named first
    keys = [*own, *(k for k in saved if k not in own)]
    differing = []
    for key in keys:
        mine, theirs = own.get(key), saved.get(key)
        if (
            mine is None
            or theirs is None
            or (
                isinstance(mine, torch.Tensor)
                and isinstance(theirs, torch.Tensor)
                and tuple(mine.shape) != tuple(theirs.shape)
            )
        ):
            differing.append(f"{key}: checkpoint {_shape(theirs)}, {name} {_shape(mine)}")
    if differing:
        more = (
            f" (and {len(differing) - 1} more: {'; '.join(differing[1:4])}"
            + ("..." if len(differing) > 4 else "")
            + ")"
            if len(differing) > 1
            else ""
        )
        raise ValueError(
            f"the checkpoint holds the weights of another model than {name}: "
            f"the first parameter that differs is {differing[0]}{more}"
        )


def _shape(value: Any) -> str:
    if value is None:
        return "missing"
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
