"""The check a checkpoint save makes of the weights: never write non-finite parameters
over the good checkpoints. Made at the save only (one device sync then), never per step;
buffers and the loss are not checked, because AMP's scaler and masks hold inf on purpose."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_finite_parameters"]


def check_finite_parameters(engine: Any, epoch: int, step: int, group: Any = None) -> None:
    """Raise, naming the step and the parameters, if the model's parameters hold NaN or
    inf. ``group``: a sharded save's process group; each process sees its own shards,
    so their verdicts are all-reduced and every process refuses together (one refusing
    alone would leave the others in the save's collectives)."""
    get_module = getattr(engine.model, "model", None)
    module = get_module() if callable(get_module) else None
    if not isinstance(module, torch.nn.Module):
        return
    with torch.no_grad():  # a DTensor's to_local() is then its shard, not an autograd op
        params = [_local(p) for p in module.parameters()]
        finite = _all_finite([p for p in params if p.is_floating_point() or p.is_complex()])
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
    shown = (
        ("parameters " + ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))
        if bad
        else ("parameters of another process's shards")
    )
    raise FloatingPointError(
        f"not saving the checkpoint of epoch {epoch}, step {step}: {shown} hold "
        f"NaN or inf (the training diverged), and the checkpoints before it are kept. Attach "
        f"runmodel.packs.NaNGuard() to skip (or stop at) the steps whose loss or gradients are "
        f"not finite, or lower the learning rate, and resume from the last good checkpoint"
    )


_MIN_MAX = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _all_finite(params: list[torch.Tensor]) -> bool:
    """Whether no tensor of ``params`` holds NaN or inf: each one's minimum and maximum
    in one pass (NaN propagates to both, an inf is one of them), with no temporary as
    large as the tensor, then one verdict per device and dtype (``isfinite().all()`` of
    each wrote a temporary as large as the parameter and read it again: the check cost
    twice the async save's copy of the whole state)."""
    extremes: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    verdicts = []
    for p in params:
        if p.is_complex():
            p = torch.view_as_real(p)
        if p.dtype in _MIN_MAX and p.numel():
            extremes.setdefault((p.device, p.dtype), []).extend(torch.aminmax(p))
        else:
            verdicts.append(p.isfinite().all())
    verdicts += [torch.stack(values).isfinite().all() for values in extremes.values()]
    if not verdicts:
        return True
    device = verdicts[0].device  # one sync
    return bool(torch.stack([verdict.to(device) for verdict in verdicts]).all())


def _local(p: torch.Tensor) -> torch.Tensor:
    """A sharded parameter's own shard (a DTensor's local tensor); else the tensor."""
    to_local = getattr(p, "to_local", None)
    return (to_local() if callable(to_local) else p).detach()
