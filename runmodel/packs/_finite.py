"""The check a checkpoint save makes of the weights: never write non-finite parameters
over the good checkpoints. Made at the save only (one device sync then), never per step;
buffers and the loss are not checked, because AMP's scaler and masks hold inf on purpose.
A background writer that ``checks_finite`` makes it on its copy instead (the plain one,
``checkpoint.writer.Writer``, and the sharded one): the parameters are then read once."""

from __future__ import annotations

from typing import Any

import torch

from ..checkpoint.writer import all_finite, nonfinite_error

__all__ = ["check_finite_parameters", "module_of"]


def module_of(engine: Any) -> torch.nn.Module | None:
    """The network of the engine's model (``model.model()``), or None: none to check."""
    get_module = getattr(engine.model, "model", None)
    module = get_module() if callable(get_module) else None
    return module if isinstance(module, torch.nn.Module) else None


def check_finite_parameters(engine: Any, epoch: int, step: int, group: Any = None) -> None:
    """Raise, naming the step and the parameters, if the model's parameters hold NaN or
    inf. ``group``: a sharded save's process group; each process sees its own shards,
    so their verdicts are all-reduced and every process refuses together (one refusing
    alone would leave the others in the save's collectives)."""
    module = module_of(engine)
    if module is None:
        return
    with torch.no_grad():  # a DTensor's to_local() is then its shard, not an autograd op
        params = [_local(p) for p in module.parameters()]
        finite = all_finite([p for p in params if p.is_floating_point() or p.is_complex()])
    everywhere = finite
    if group is not None:
        import torch.distributed as dist

        verdict = torch.tensor([int(finite)], dtype=torch.int32)  # the group is gloo: CPU
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN, group=group)
        everywhere = bool(verdict.item())
    if everywhere:
        return
    bad = [
        name
        for name, p in module.named_parameters()
        if (p.is_floating_point() or p.is_complex()) and not bool(_local(p).isfinite().all())
    ]
    raise nonfinite_error(f"of epoch {epoch}, step {step}", bad)


def _local(p: torch.Tensor) -> torch.Tensor:
    """A sharded parameter's own shard (a DTensor's local tensor); else the tensor."""
    to_local = getattr(p, "to_local", None)
    return (to_local() if callable(to_local) else p).detach()
