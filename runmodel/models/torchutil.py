"""Small torch helpers for models: devices, wrapped modules."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

__all__ = ["needs_closure", "torch_device", "unwrap"]


def needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` must be given a closure that recomputes the loss (its
    ``closure`` parameter has no default, as ``torch.optim.LBFGS``'s)."""
    try:
        parameters = inspect.signature(optimizer.step).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    closure = parameters.get("closure")
    return closure is not None and closure.default is inspect.Parameter.empty


def unwrap(module: nn.Module | None) -> nn.Module | None:
    """The module itself when ``torch.compile`` or ``DistributedDataParallel`` wrapped it
    (its state dict's keys are the original module's)."""
    module = getattr(module, "_orig_mod", module)
    if isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        module = unwrap(module.module)
    return module


def torch_device(device: str | torch.device | None) -> torch.device:
    """The device asked for, checked: an unknown or absent device is a clear error.
    ``None`` picks CUDA when there is one, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device {device!r} is not a device torch knows ({error}); use "
            f"'cpu', 'cuda', 'cuda:N' or 'mps'"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ValueError(
                f"device {device!r} asked for, but no CUDA device is available "
                f"(torch {torch.__version__}, {build}); use device='cpu'"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} asked for, but there are only "
                f"{torch.cuda.device_count()} CUDA devices"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} asked for, but MPS is not available here")
    return dev
