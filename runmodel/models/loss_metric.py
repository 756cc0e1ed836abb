"""The loss a ``TorchModel`` is evaluated with: pytorch-ignite's ``Loss``, summed as
scripts sum it. Imported when a model's metrics are made (ignite is not imported
before)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from ignite.exceptions import NotComputableError
from ignite.metrics import Loss
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from .metrics import REDUCTIONS
from .outputs import output_loss

__all__ = ["DoubleLoss", "OutputLoss"]


class DoubleLoss(Loss):
    """``ignite.metrics.Loss`` summed as a script sums its evaluation loss, bit for bit
    (``n``: a batch's size, ``len(y)`` by ``batch_size``; ``N``: the sum of them):

    - ``reduction="mean"`` (the default): ``total += loss_fn(out, y).item() * n``, then
      ``total / N``. Each batch's mean loss times its size is added in double precision
      (where ignite's float32 sum differs in the 8th digit, enough to flip a near-tie for
      "best").
    - ``"sum"``: ``total += loss_fn(out, y, reduction="sum").item()``, then ``total / N``
      (as pytorch/examples' MNIST ``test()``); a loss module (``nn.NLLLoss()``) is
      called as a copy of itself with ``reduction="sum"``.
    - ``"float32"``: a Lightning module's ``self.log("val_loss", loss)`` epoch value: a
      float32 sum of ``loss * n`` over a float32 count.

    Adding stays on the device: no sync per batch. On a device without float64 (Apple's
    MPS) it sums in float32, as ignite does."""

    def __init__(
        self,
        loss_fn: Callable[..., torch.Tensor],
        *args: Any,
        reduction: str = "mean",
        **kwargs: Any,
    ) -> None:
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"DoubleLoss(reduction=) is one of {', '.join(map(repr, REDUCTIONS))}; "
                f"got {reduction!r}"
            )
        self.reduction = reduction
        # what reduced_by makes a copy with
        self._given = (loss_fn, args, kwargs)
        super().__init__(_summing(loss_fn) if reduction == "sum" else loss_fn, *args, **kwargs)

    def reduced_by(self, reduction: str) -> DoubleLoss:
        """This metric, summing by ``reduction`` instead."""
        if reduction == self.reduction:
            return self
        loss_fn, args, kwargs = self._given
        return DoubleLoss(loss_fn, *args, reduction=reduction, **kwargs)

    @reinit__is_reduced
    def reset(self) -> None:
        wide = self.reduction != "float32" and self._device.type != "mps"
        self._sum = torch.tensor(0.0, dtype=torch.float64 if wide else torch.float32)
        self._sum = self._sum.to(self._device)
        self._count32 = torch.tensor(0.0, dtype=torch.float32, device=self._device)
        self._num_examples = 0

    @reinit__is_reduced
    def update(self, output: Any) -> None:
        if len(output) == 2:
            y_pred, y = output
            kwargs: dict[str, Any] = {}
        else:
            y_pred, y, kwargs = output
        loss = self._loss_fn(y_pred, y, **kwargs).detach()
        if len(loss.shape) != 0:
            raise ValueError("loss_fn did not return the average loss.")
        n = self._batch_size(y)
        if self.reduction == "mean":  # the default first: one comparison a batch
            if loss.device == self._sum.device:
                # in the sum's dtype (loss * n is exact in float64): no temporary per batch
                self._sum.add_(loss, alpha=n)
            else:
                self._sum += loss.to(self._device, self._sum.dtype) * n
        elif self.reduction == "sum":  # the batch's sum as it is
            self._sum += loss.to(self._device, self._sum.dtype)
        else:  # "float32", as Lightning: the rounded product, then the sum
            self._sum += loss.to(self._device, torch.float32) * n
            self._count32 += n
        self._num_examples += n

    @sync_all_reduce("_sum", "_num_examples", "_count32")
    def compute(self) -> float:
        if self._num_examples == 0:
            raise NotComputableError(
                "Loss must have at least one example before it can be computed."
            )
        if self.reduction == "float32":  # a float32 quotient, as Lightning's
            return float((self._sum / self._count32).item())
        return self._sum.item() / self._num_examples


def _summing(loss_fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``loss_fn`` giving a batch's sum: a loss module's copy with ``reduction="sum"``,
    else the function called with ``reduction="sum"``."""
    if isinstance(loss_fn, torch.nn.Module) and hasattr(loss_fn, "reduction"):
        module = copy.copy(loss_fn)  # the user's module keeps its own reduction
        module.reduction = "sum"  # type: ignore[assignment]  # a str on every torch loss
        return module

    def summed(output: Any, target: Any, **kwargs: Any) -> torch.Tensor:
        return loss_fn(output, target, reduction="sum", **kwargs)

    return summed


class OutputLoss(DoubleLoss):
    """The loss a module computes itself (a Hugging Face model's ``output.loss``), summed
    as ``DoubleLoss`` sums a ``loss_fn``'s: ``loss * len(labels)`` in double precision
    over the batches, divided by their sizes (as the Hugging Face ``Trainer``'s
    ``eval_loss`` weighs its batches). Fed the module's whole output
    (``reads_output``), not its logits."""

    reads_output = True

    def __init__(self, *args: Any, reduction: str = "mean", **kwargs: Any) -> None:
        if reduction == "sum":
            raise ValueError(
                "the loss a module computes is its own mean: it cannot be summed with "
                "reduction='sum'; set a loss_fn to evaluate the loss that way"
            )
        super().__init__(_computed, *args, reduction=reduction, **kwargs)

    def reduced_by(self, reduction: str) -> DoubleLoss:
        if reduction == self.reduction:
            return self
        _, args, kwargs = self._given
        return OutputLoss(*args, reduction=reduction, **kwargs)


def _computed(output: Any, target: Any) -> torch.Tensor:
    return output_loss(output, "the model")
