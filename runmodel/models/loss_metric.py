"""The loss a ``TorchModel`` is evaluated with: pytorch-ignite's ``Loss``, summed in
double precision. Imported when a model's metrics are made (ignite is not imported
before)."""

from __future__ import annotations

from typing import Any

import torch
from ignite.metrics import Loss
from ignite.metrics.metric import reinit__is_reduced

__all__ = ["DoubleLoss"]


class DoubleLoss(Loss):
    """``ignite.metrics.Loss`` whose running sum is a float64 tensor on its device: each
    batch adds ``loss * n`` computed in double precision (``n``: the batch's size, by
    ``batch_size``), as a script's ``total += len(batch) * loss.item()`` does with Python
    floats. So the mean over an evaluation equals that script's ``total / count`` bit for
    bit, where ignite's float32 sum differs in the 8th digit (enough to flip a near-tie
    for "best"). Adding stays on the device: no sync per batch. On a device without
    float64 (Apple's MPS) it sums in float32, as ignite does."""

    @reinit__is_reduced
    def reset(self) -> None:
        dtype = torch.float32 if self._device.type == "mps" else torch.float64
        self._sum = torch.tensor(0.0, dtype=dtype, device=self._device)
        self._num_examples = 0

    @reinit__is_reduced
    def update(self, output: Any) -> None:
        if len(output) == 2:
            y_pred, y = output
            kwargs: dict[str, Any] = {}
        else:
            y_pred, y, kwargs = output
        average_loss = self._loss_fn(y_pred, y, **kwargs).detach()
        if len(average_loss.shape) != 0:
            raise ValueError("loss_fn did not return the average loss.")
        n = self._batch_size(y)
        if average_loss.device == self._sum.device:
            # in the sum's dtype (loss * n is exact in float64): no temporary per batch
            self._sum.add_(average_loss, alpha=n)
        else:
            self._sum += average_loss.to(self._device, self._sum.dtype) * n
        self._num_examples += n
