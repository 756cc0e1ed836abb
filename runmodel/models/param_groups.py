"""The optimizer's param groups a fine-tuner builds: weight decay except on the parameters
a no-decay list names (biases and LayerNorm weights, the Hugging Face default), and a
learning-rate factor per part of the module (layer-wise lr decay)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch import nn

from ..core.checks import did_you_mean, is_number

__all__ = ["NO_DECAY", "param_groups"]

#: The parameters that get no weight decay by default: a name containing one of these
#: (as the Hugging Face recipes write it).
NO_DECAY = ("bias", "LayerNorm.weight")

LrScale = Mapping[str, float] | Callable[[str], float]


def param_groups(
    module: nn.Module,
    *,
    weight_decay: float = 0.0,
    no_decay: Iterable[str] = NO_DECAY,
    lr: float | None = None,
    lr_scale: LrScale | None = None,
) -> list[dict[str, Any]]:
    """Param groups of all of ``module``'s parameters (frozen ones too: an optimizer has
    no state for a parameter until it trains, and a layer unfrozen later trains then),
    for any torch optimizer: ``torch.optim.AdamW(param_groups(module, weight_decay=0.01,
    lr=2e-5), lr=2e-5)``.

    A parameter whose name contains one of ``no_decay`` (``"bias"``,
    ``"LayerNorm.weight"``) gets ``weight_decay=0``, the others ``weight_decay``.
    ``lr_scale`` gives parts of the module a learning rate of ``lr`` times a factor: a
    mapping of module or parameter names to factors (a parameter takes the factor of the
    longest name it is in; the rest 1), as layer-wise lr decay writes it
    (``{f"bert.encoder.layer.{i}": 0.9 ** (12 - i) for i in range(12)}``), or a function
    of a parameter's name. One group per (decay, factor), in the module's order; each
    group's ``lr_scale`` says its factor. Every name in ``lr_scale`` must name something
    of the module."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"param_groups takes a torch.nn.Module, got {type(module).__name__}")
    if not is_number(weight_decay) or weight_decay < 0:
        raise ValueError(f"param_groups(weight_decay=) is a number >= 0, got {weight_decay!r}")
    if isinstance(no_decay, str) or not all(isinstance(n, str) for n in no_decay):
        raise TypeError(
            f"param_groups(no_decay=) is a list of name parts, such as "
            f"{list(NO_DECAY)!r}; got {no_decay!r}"
        )
    skip = tuple(no_decay)
    named = list(module.named_parameters())
    scale_of = _scales(lr_scale, module, named)
    if scale_of is not None and lr is None:
        raise ValueError(
            "param_groups(lr_scale=) scales the learning rate lr=: give lr= (the "
            "optimizer's, for the parts whose factor is 1)"
        )
    groups: dict[tuple[bool, float], dict[str, Any]] = {}
    for name, p in named:
        decays = not any(part in name for part in skip)
        scale = 1.0 if scale_of is None else float(scale_of(name))
        group = groups.get((decays, scale))
        if group is None:
            group = {"params": [], "weight_decay": weight_decay if decays else 0.0}
            if lr is not None:
                group["lr"] = lr * scale if scale != 1.0 else lr
            if scale_of is not None:
                group["lr_scale"] = scale
            groups[(decays, scale)] = group
        group["params"].append(p)
    return list(groups.values())


def _scales(
    lr_scale: LrScale | None, module: nn.Module, named: list[tuple[str, nn.Parameter]]
) -> Callable[[str], float] | None:
    """A parameter's lr factor by its name, from ``lr_scale`` (checked against the
    module's names)."""
    if lr_scale is None:
        return None
    if callable(lr_scale):
        return lr_scale
    if not isinstance(lr_scale, Mapping):
        raise TypeError(
            f"param_groups(lr_scale=) is a mapping of module names to lr factors, or a "
            f"function of a parameter's name; got {lr_scale!r}"
        )
    names = [n for n, _ in module.named_modules() if n] + [n for n, _ in named]
    for key, factor in lr_scale.items():
        if key not in names:
            raise ValueError(
                f"param_groups(lr_scale=) names {key!r}, and {type(module).__name__} has "
                f"no module or parameter of that name.{did_you_mean(key, names)}"
            )
        if not is_number(factor, above=0):
            raise ValueError(
                f"param_groups(lr_scale=): {key!r}'s factor is a number > 0, got {factor!r}"
            )
    # the longest name first: a parameter takes the factor of the innermost part it is in
    ordered = sorted(lr_scale.items(), key=lambda item: -len(item[0]))

    def scale(name: str) -> float:
        for key, factor in ordered:
            if name == key or name.startswith(key + "."):
                return float(factor)
        return 1.0

    return scale
