"""Train a model in stages: parts of its module stay frozen until the epoch a schedule
names, optionally each stage with its own learning-rate scale."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from ..core import Pack, hook
from ..core.checks import did_you_mean, is_number, is_whole_number
from ..models import unwrap

if TYPE_CHECKING:
    import torch

    from ..core import BareEngine as Engine

__all__ = ["Unfreeze"]

ALL = "all"
#: The marks a param group regrouped by ``lr_scale=`` carries: the stage (the epoch its
#: parameters train from; None: never by the schedule) and the factor its lr was scaled by.
STAGE_KEY, SCALE_KEY = "unfreeze_epoch", "unfreeze_lr_scale"

Schedule = dict[int, tuple[str, ...] | str]
_EXAMPLE = "{0: ['head'], 2: ['layer4'], 4: 'all'}"


class Unfreeze(Pack):
    """Freeze the model's module and unfreeze it in stages: ``schedule`` maps epochs
    (counted from 0 like ``state.epoch``) to module names, name prefixes or parameter
    names, or ``"all"``, as in ``{0: ["head"], 2: ["layer4"], 4: "all"}``.

    At each epoch's start, the parameters listed at that epoch or earlier are trainable
    and every other parameter of the module is frozen (``requires_grad=False``, and its
    gradient dropped), so the frozen set is a function of the epoch and right after a
    resume. A name is a module (everything in it), a parameter, or, when no module or
    parameter has that exact name, a prefix of names (``"layer"``: ``layer1``,
    ``layer2``...). Names are checked against the module when the run starts.

    ``lr_scale={epoch: factor}`` splits the optimizer's param groups in place, one per
    stage, each with its original group's lr times the factor of the stage its
    parameters train from (stages not listed keep their lr). There is no default scale.

    Train runs only; teardown gives every parameter back the ``requires_grad`` it had.
    """

    name = "unfreeze"
    repeatable = False  # a second one would compound the first

    def __init__(
        self,
        schedule: Mapping[int | str, str | Iterable[str]],
        lr_scale: Mapping[int | str, float] | None = None,
    ) -> None:
        self.schedule = _check_schedule(schedule)
        self.lr_scale = _check_lr_scale(lr_scale, self.schedule)
        # each parameter of the module and the epoch it trains from (None: never)
        self._plan: list[tuple[nn.Parameter, int | None]] = []
        self._flags: list[tuple[nn.Parameter, bool]] = []  # requires_grad before the run

    # -- hooks ---------------------------------------------------------------------------

    @hook(priority=50, modes="train")  # before other setup hooks (LRSchedule builds after)
    def setup(self, engine: Engine) -> None:
        module = unwrap(getattr(engine.model, "module", None))
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"Unfreeze needs a model with a torch module (a TorchModel's "
                f"module); {type(engine.model).__name__}.module is "
                f"{type(module).__name__}"
            )
        stages = self._stages(module)
        _check_optimizer_holds(getattr(engine.model, "optimizer", None), module, stages)
        self._plan = list(stages.values())
        self._flags = [(p, p.requires_grad) for p, _ in self._plan]
        epoch = engine.state.epoch
        if not any(stage is not None and stage <= epoch for _, stage in self._plan):
            raise ValueError(
                f"Unfreeze: no parameter of the module is trainable at epoch "
                f"{epoch} (the schedule's first stage is epoch "
                f"{min(self.schedule)}), so the first backward would fail; list "
                f"what trains from the start under epoch 0"
            )
        if self.lr_scale is not None:
            optimizer = getattr(engine.model, "optimizer", None)
            if optimizer is None:
                raise ValueError(
                    "Unfreeze(lr_scale=) scales the optimizer's param groups, but "
                    "the model has no optimizer when the run starts"
                )
            self._regroup(optimizer, {id(p): stage for p, stage in self._plan})
        self._apply(epoch)

    @hook(priority=100, modes="train")  # first: other epoch_start hooks see the frozen set
    def epoch_start(self, engine: Engine) -> None:
        self._apply(engine.state.epoch)

    @hook(modes="train")
    def teardown(self, engine: Engine) -> None:
        for p, flag in self._flags:
            p.requires_grad_(flag)
        self._plan, self._flags = [], []

    # -- the schedule ----------------------------------------------------------------------

    def frozen(self, epoch: int) -> list[nn.Parameter]:
        """The module's parameters frozen at ``epoch`` (in the run that is going on)."""
        return [p for p, stage in self._plan if stage is None or stage > epoch]

    def _apply(self, epoch: int) -> None:
        for p, stage in self._plan:
            trainable = stage is not None and stage <= epoch
            if p.requires_grad != trainable:
                p.requires_grad_(trainable)
            if not trainable:
                p.grad = None  # an old gradient would still move it (and weight decay)

    def _stages(self, module: nn.Module) -> dict[int, tuple[nn.Parameter, int | None]]:
        """Per parameter (by id): the parameter and the first epoch that lists it."""
        named = list(module.named_parameters(remove_duplicate=False))
        modules = [n for n, _ in module.named_modules() if n]
        stages: dict[int, tuple[nn.Parameter, int | None]] = {id(p): (p, None) for _, p in named}
        for epoch, names in self.schedule.items():  # ascending: the earliest stage wins
            for p in _match(names, epoch, module, named, modules):
                if stages[id(p)][1] is None:
                    stages[id(p)] = (p, epoch)
        return stages

    # -- lr_scale ----------------------------------------------------------------------------

    def _scale(self, stage: int | None) -> float:
        return 1.0 if stage is None or self.lr_scale is None else self.lr_scale.get(stage, 1.0)

    def _regroup(self, optimizer: torch.optim.Optimizer, stage_of: dict[int, int | None]) -> None:
        """One param group per (original group, stage), each with its original group's
        options and lr times the stage's factor; in place, so per-parameter state stays. A
        group this schedule marked already is left as it is (a second run of the model)."""
        groups = optimizer.param_groups
        if all(
            STAGE_KEY in g
            and g.get(SCALE_KEY) == self._scale(g[STAGE_KEY])
            and all(stage_of.get(id(p)) == g[STAGE_KEY] for p in g["params"])
            for g in groups
        ):
            return
        regrouped: list[dict[str, Any]] = []
        for group in groups:
            before = group.get(SCALE_KEY, 1.0)  # a group another schedule scaled
            options = {k: v for k, v in group.items() if k != "params"}
            by_stage: dict[int | None, list[nn.Parameter]] = {}
            for p in group["params"]:
                by_stage.setdefault(stage_of.get(id(p)), []).append(p)
            for stage in sorted(by_stage, key=lambda s: math.inf if s is None else s):
                factor = self._scale(stage)
                new = {**options, "params": by_stage[stage], STAGE_KEY: stage, SCALE_KEY: factor}
                for key in ("lr", "initial_lr"):  # a scheduler's base lr scales too
                    if key in new:
                        value = new[key] if before == 1.0 else new[key] / before
                        new[key] = value * factor if factor != 1.0 else value
                regrouped.append(new)
        groups[:] = regrouped

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {}  # the epoch decides what is frozen: nothing else to keep


def _check_optimizer_holds(
    optimizer: Any, module: nn.Module, stages: dict[int, tuple[nn.Parameter, int | None]]
) -> None:
    """Every parameter the schedule trains is in the optimizer: one built over the
    trainable parameters only (``filter(lambda p: p.requires_grad, ...)``, after the
    model froze some) would never update the layers unfrozen later, silently."""
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list):
        return  # no optimizer (an override makes the update): nothing to check
    held = {id(p) for group in groups for p in group["params"]}
    missing = [
        (name, stage)
        for name, p in module.named_parameters()
        if (stage := stages[id(p)][1]) is not None and id(p) not in held
    ]
    if missing:
        name, stage = missing[0]
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ValueError(
            f"Unfreeze: the optimizer does not hold {name!r} (trained from epoch "
            f"{stage}){more}, so it would never be updated: the optimizer was built "
            f"over some of the module's parameters (the trainable ones only?). Build it "
            f"over all of them, as torch.optim.AdamW(module.parameters()) or "
            f"runmodel.param_groups(module, ...): a frozen parameter gets no gradient, "
            f"so the optimizer keeps no state for it until it trains"
        )


# -- checks, when the pack is made ---------------------------------------------------------------


def _epoch(key: object, what: str) -> int:
    """A schedule key: an int >= 0, or its digits as a string (a TOML/JSON config's keys)."""
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    if not is_whole_number(key):
        raise ValueError(
            f"Unfreeze: {what} keys are epochs, whole numbers >= 0 counted from 0 "
            f"like state.epoch (as in {_EXAMPLE}); got {key!r}"
        )
    return key


def _check_schedule(schedule: object) -> Schedule:
    if not isinstance(schedule, Mapping) or not schedule:
        raise TypeError(
            f"Unfreeze(schedule=) takes a dict of epochs to module names or 'all', "
            f"such as {_EXAMPLE}; got {schedule!r}"
        )
    checked: Schedule = {}
    for key, names in schedule.items():
        epoch = _epoch(key, "schedule")
        if epoch in checked:
            raise ValueError(
                f"Unfreeze: epoch {epoch} appears twice in the schedule ({key!r}); "
                f"list its modules once"
            )
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, (list, tuple, set, frozenset)) or not all(
            isinstance(n, str) and n for n in names
        ):
            raise TypeError(
                f"Unfreeze: schedule[{epoch}] must be a module name, a list of "
                f"module names or name prefixes, or 'all'; got {names!r}"
            )
        checked[epoch] = ALL if ALL in names else tuple(names)
    if not any(checked.values()):
        raise ValueError(
            f"Unfreeze: the schedule {schedule!r} names no module, so everything "
            f"would stay frozen; write it as {_EXAMPLE}"
        )
    ordered = dict(sorted(checked.items()))
    everything = next((e for e, names in ordered.items() if names == ALL), None)
    later = [e for e in ordered if everything is not None and e > everything]
    if later:  # what reads like "freeze again at epoch N": a schedule only ever unfreezes
        raise ValueError(
            f"Unfreeze: the schedule unfreezes 'all' at epoch {everything}, then "
            f"lists {list(ordered[later[0]])!r} at epoch {later[0]}; a schedule only "
            f"unfreezes, and what an epoch lists trains from then on, so nothing "
            f"is left to unfreeze after 'all' (and nothing freezes again). Drop "
            f"the later stages, or move 'all' to the last epoch"
        )
    return ordered


def _check_lr_scale(lr_scale: object, schedule: Schedule) -> dict[int, float] | None:
    if lr_scale is None or (isinstance(lr_scale, Mapping) and not lr_scale):
        return None
    if not isinstance(lr_scale, Mapping):
        raise TypeError(
            f"Unfreeze(lr_scale=) takes a dict of schedule epochs to factors, such "
            f"as {{2: 0.1}}, or None; got {lr_scale!r}"
        )
    checked: dict[int, float] = {}
    for key, factor in lr_scale.items():
        epoch = _epoch(key, "lr_scale")
        if epoch not in schedule:
            raise ValueError(
                f"Unfreeze: lr_scale names epoch {epoch}, which is not a stage of "
                f"the schedule (stages: {', '.join(map(str, schedule))})"
            )
        if not is_number(factor, above=0) or not math.isfinite(factor):
            raise ValueError(
                f"Unfreeze: lr_scale[{epoch}] must be a number > 0 (the factor "
                f"of that stage's learning rate); got {factor!r}"
            )
        checked[epoch] = float(factor)
    return checked


# -- names, when the run starts ---------------------------------------------------------------


def _match(
    names: tuple[str, ...] | str,
    epoch: int,
    module: nn.Module,
    named: list[tuple[str, nn.Parameter]],
    modules: list[str],
) -> list[nn.Parameter]:
    """The parameters ``names`` stand for: all of them, a module's, a parameter, or those
    under a prefix of names. An unknown name is an error with a did-you-mean."""
    if names == ALL:
        return [p for _, p in named]
    found: list[nn.Parameter] = []
    for name in names:
        exact = name in modules or any(n == name for n, _ in named)
        under = name + "."
        hits = (
            [p for n, p in named if n == name or n.startswith(under)]
            if exact
            else [p for n, p in named if n.startswith(name)]
        )
        if not exact and not hits and not any(m.startswith(name) for m in modules):
            hint = did_you_mean(name, modules + [n for n, _ in named])
            top = [n for n, _ in module.named_children()] or [n for n, _ in named]
            shown = ", ".join(top[:12]) + (", ..." if len(top) > 12 else "")
            raise ValueError(
                f"Unfreeze: schedule[{epoch}] names {name!r}, but "
                f"{type(module).__name__} has no module or parameter of that name "
                f"or starting with it.{hint} Its modules: {shown or 'none'}"
            )
        found.extend(hits)
    return found
