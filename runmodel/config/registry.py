"""Registries: names for models, interfaces, backends, packs, optimizers and losses.

``register_model("digits", factory)`` (or ``@register_model("digits")``) makes
``make_model(Spec("digits", {...}))`` build it; a second registration of a name is an
error naming both places. ``make_*`` check that the factory returned the right kind of
thing. Built-ins (torch optimizers, common losses, runmodel's backends and packs) are
registered on first use.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends import Backend
from ..core import Pack
from ..core.checks import did_you_mean
from ..models import Interface, Model
from . import builtins
from .overrides import ConfigError, unknown_option

__all__ = [
    "GROUP_ARGS",
    "ConfigError",
    "OptimizerFactory",
    "Registry",
    "Spec",
    "check_model_args",
    "check_setup_args",
    "known_model_args",
    "make_backend",
    "make_interface",
    "make_loss",
    "make_model",
    "make_optimizer",
    "make_pack",
    "optimizer_factory",
    "register_backend",
    "register_interface",
    "register_loss",
    "register_model",
    "register_optimizer",
    "register_pack",
    "register_schedule",
    "registries",
    "schedule_function",
]


@dataclass(frozen=True)
class Spec:
    """A registered thing named as data: its registry name and the arguments it takes."""

    type_: str
    args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Spec | str | dict[str, Any], what: str) -> Spec:
        """A spec from a ``Spec``, a bare name, or ``{"type": name, "args": {...}}``."""
        if isinstance(value, Spec):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict) and isinstance(value.get("type"), str):
            extra = set(value) - {"type", "args"}
            if extra:
                raise ValueError(
                    f"{what}: unknown key(s) {sorted(extra)}; a spec has 'type' and 'args'"
                )
            args = value.get("args", {})
            args = {} if args is None else args
            if not isinstance(args, dict):
                raise TypeError(f"{what}: 'args' must be a table/dict, got {args!r}")
            return cls(value["type"], dict(args))
        raise TypeError(
            f"{what}: give a registered name or {{type = NAME, args = {{...}}}}, got {value!r}"
        )


def _place(obj: object) -> str:
    """Where ``obj`` was defined: its name and file:line (or, without a source file, its
    name and identity, so that two such objects are never the same place)."""
    target: Any = inspect.unwrap(obj) if callable(obj) else obj
    name = getattr(target, "__qualname__", type(target).__name__)
    code = getattr(target, "__code__", None)
    # a real path: one file imported as configs/../digits.py and as digits.py is one place
    if code is not None and not code.co_filename.startswith("<"):
        return f"{name} ({os.path.realpath(code.co_filename)}:{code.co_firstlineno})"
    try:
        source = inspect.getsourcefile(target)
        return f"{name} ({source and os.path.realpath(source)}:{inspect.getsourcelines(target)[1]})"
    except (TypeError, OSError):
        return f"{name} (defined without a source file, id {id(target):#x})"


class Registry:
    """Names to factories for one kind of thing."""

    def __init__(self, kind: str, check: Callable[[Any], bool], expected: str) -> None:
        self.kind, self.check, self.expected = kind, check, expected
        self._factories: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, factory: Callable[..., Any] | None = None) -> Any:
        """Register ``factory`` as ``name``; without ``factory``, a decorator."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        _load_builtins()  # so that taking a built-in's name fails here, not later
        if factory is None:

            def decorate(factory: Callable[..., Any]) -> Callable[..., Any]:
                self.register(name, factory)
                return factory

            return decorate
        if not callable(factory):
            raise TypeError(
                f"register_{self.kind}({name!r}, ...) needs a callable factory, got {factory!r}"
            )
        old = self._factories.get(name)
        if old is not None and _place(old) == _place(factory) and old is not factory:
            self._factories[name] = factory  # the same code loaded again (a re-imported file)
            return factory
        if old is not None:
            raise ValueError(
                f"{self.kind} {name!r} is registered already, by "
                f"{_place(old)}; now again by "
                f"{_place(factory)}. Choose another name"
            )
        self._factories[name] = factory
        return factory

    def names(self) -> list[str]:
        _load_builtins()
        return sorted(self._factories)

    def get(self, name: str) -> Callable[..., Any]:
        _load_builtins()
        if name not in self._factories:
            raise KeyError(
                f"no {self.kind} registered as {name!r}.{did_you_mean(name, self._factories)}"
                " Registered: "
                f"{', '.join(sorted(self._factories)) or 'none'}"
            )
        return self._factories[name]

    def make(
        self,
        spec: Spec | str | dict[str, Any],
        *args: Any,
        args_as: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call the factory ``spec`` names with ``*args``, ``**kwargs`` and the spec's args
        (as keywords, or as the one keyword ``args_as``)."""
        spec = Spec.of(spec, self.kind)
        factory = self.get(spec.type_)
        given = {args_as: spec.args} if args_as is not None else spec.args
        try:
            made = factory(*args, **kwargs, **given)
        except TypeError as error:
            raise TypeError(
                f"{self.kind} {spec.type_!r} ({_place(factory)}) could not be made "
                f"with args {spec.args}: {error}"
            ) from error
        if not self.check(made):
            raise TypeError(
                f"{self.kind} {spec.type_!r}: its factory {_place(factory)} "
                f"returned {type(made).__name__} {made!r}, not {self.expected}"
            )
        return made

    def __contains__(self, name: object) -> bool:
        _load_builtins()
        return name in self._factories


def _is_model(obj: object) -> bool:
    return isinstance(obj, Model)


def _is_interface(obj: object) -> bool:
    return isinstance(obj, Interface)


def _is_backend(obj: object) -> bool:
    return isinstance(obj, Backend)


def _is_pack(obj: object) -> bool:
    return isinstance(obj, Pack)


def _is_optimizer(obj: object) -> bool:
    return isinstance(obj, torch.optim.Optimizer)


registries: dict[str, Registry] = {
    "model": Registry("model", _is_model, "a runmodel.Model"),
    "interface": Registry("interface", _is_interface, "a runmodel.Interface"),
    "backend": Registry("backend", _is_backend, "a runmodel.Backend"),
    "pack": Registry("pack", _is_pack, "a runmodel.Pack"),
    "optimizer": Registry("optimizer", _is_optimizer, "a torch.optim.Optimizer"),
    "loss": Registry("loss", callable, "a callable loss"),
    "schedule": Registry("schedule", callable, "a function of the iteration"),
}

register_model = registries["model"].register
register_interface = registries["interface"].register
register_backend = registries["backend"].register
register_pack = registries["pack"].register
register_optimizer = registries["optimizer"].register
register_loss = registries["loss"].register
#: ``register_schedule(name, fn)``: a closed-form learning rate ``fn(iteration, **args) ->
#: lr`` that a config's ``LRSchedule`` names, ``lr_at = "name"`` or ``lr_at = {type =
#: "name", args = {...}}`` (``LRSchedule(lr_at=)``).
register_schedule = registries["schedule"].register


def make_model(
    spec: Spec | str | dict[str, Any], name: str | None = None, device: str | None = None
) -> Any:
    """Build a registered model. A ``Model`` subclass registered as a factory is called as
    ``cls(device=, init_options=args)``; any other factory as
    ``factory(name=, device=, **args)``."""
    spec = Spec.of(spec, "model")
    factory = registries["model"].get(spec.type_)
    if inspect.isclass(factory) and issubclass(factory, Model):
        return registries["model"].make(spec, device=device, args_as="init_options")
    return registries["model"].make(spec, name=name or spec.type_, device=device)


def _declared_init_options(spec: Spec) -> tuple[str, dict[str, Any] | None]:
    """The registered model's name and the init options it declares (None: a factory
    that declares none takes whatever it is given)."""
    factory = registries["model"].get(spec.type_)
    declared = (
        getattr(factory, "init_defaults", None)
        if inspect.isclass(factory) and (issubclass(factory, Model))
        else None
    )
    return getattr(factory, "__name__", spec.type_), declared or None


def known_model_args(spec: Spec, where: str = "config") -> Spec:
    """``spec``, its init options checked against those its registered model declares:
    one it does not declare is refused as on the command line (``overrides.unknown_option``:
    a ``ConfigError`` with a did-you-mean and the declared names; ``where`` names the
    config). A factory that declares nothing (no ``init_defaults``) takes what it is
    given."""
    name, declared = _declared_init_options(spec)
    if not declared:
        return spec
    for key in spec.args:
        if key not in declared:
            unknown_option(
                "config",
                f"{name} (model {spec.type_!r})",
                "init",
                key,
                declared,
                given_as=f"{where}: model.args.{key}",
                declared=f"its init options: {', '.join(declared)}",
            )
    return spec


def check_setup_args(model: Any, setup: dict[str, Any], where: str = "config") -> None:
    """Refuse a config's setup option (``[setup]``) that ``model`` does not declare in its
    ``setup_defaults``, as ``known_model_args`` refuses an init option. A model that
    declares none takes what it is given."""
    declared = getattr(model, "setup_defaults", None) or {}
    for key in setup if declared else ():
        if key not in declared:
            unknown_option(
                "config",
                type(model).__name__,
                "setup",
                key,
                declared,
                given_as=f"{where}: setup.{key}",
                declared=f"its setup options: {', '.join(declared)}",
            )


def check_model_args(spec: Spec, given: dict[str, str]) -> list[str]:
    """Refuse model options named on the command line (``given``: each name, and how it
    was given, as ``--set 'model.args.hiden=3'``) that the registered model does not
    declare: a ``ConfigError`` with a did-you-mean and the options it declares
    (``overrides.unknown_option``; the model must be registered: its config's imports
    loaded). A model that declares none takes any; the names passed to it unchecked are
    returned."""
    name, declared = _declared_init_options(spec)
    if declared is None:
        return sorted(given)
    for key, how in given.items():
        if key not in declared:
            unknown_option(
                "command line",
                f"{name} (model {spec.type_!r})",
                "init",
                key,
                declared,
                given_as=how,
                declared=f"its init options: {', '.join(declared)}",
            )
    return []


def make_interface(spec: Spec | str | dict[str, Any]) -> Any:
    return registries["interface"].make(spec)


def make_backend(spec: Spec | str | dict[str, Any]) -> Any:
    """Build a registered backend; an ``optimizer`` among its args is a registered
    optimizer's spec, checked now."""
    spec = Spec.of(spec, "backend")
    if spec.args.get("optimizer") is not None:
        spec = Spec(
            spec.type_, {**spec.args, "optimizer": optimizer_factory(spec.args["optimizer"])}
        )
    return registries["backend"].make(spec)


#: An optimizer spec's arguments that make its param groups (``models.param_groups``)
#: rather than go to the optimizer: given, the optimizer is built over groups of the
#: module's parameters by name, its ``weight_decay`` and ``lr`` those of the groups.
GROUP_ARGS = ("no_decay", "lr_scale")


class OptimizerFactory:
    """The optimizer a spec names, made when the run starts: called with the module's
    parameters, or built over the module itself (``for_module``, which the backends
    call), whose names the spec's ``no_decay`` and ``lr_scale`` group by."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def __call__(self, parameters: Iterable[Any]) -> Any:
        return make_optimizer(self.spec, parameters)

    def for_module(self, module: torch.nn.Module) -> Any:
        return make_optimizer(self.spec, module)

    def __repr__(self) -> str:
        return f"OptimizerFactory({self.spec!r})"


def optimizer_factory(spec: Spec | str | dict[str, Any]) -> OptimizerFactory:
    """A factory of the optimizer ``spec`` names, called with the parameters (or built over
    the module); a bad name or bad arguments are found now, not when the run starts."""
    spec = Spec.of(spec, "optimizer")
    make_optimizer(spec, torch.nn.Linear(1, 1), check_names=False)
    return OptimizerFactory(spec)


def make_pack(spec: Spec | str | dict[str, Any], **context: Any) -> Any:
    """Build a registered pack; ``context`` (e.g. ``directory=`` for a run's directory)
    fills arguments the spec leaves out. An ``LRSchedule``'s ``lr_at`` names a registered
    schedule (``register_schedule``)."""
    spec = Spec.of(spec, "pack")
    factory = registries["pack"].get(spec.type_)
    lr_at = spec.args.get("lr_at")
    if isinstance(lr_at, (str, dict)) and _is_lr_schedule(factory):
        spec = Spec(spec.type_, {**spec.args, "lr_at": schedule_function(lr_at)})
    elif isinstance(lr_at, list) and _is_lr_schedule(factory):  # one per param group
        spec = Spec(spec.type_, {**spec.args, "lr_at": [schedule_function(s) for s in lr_at]})
    accepted = _accepted(factory)
    extra = {
        k: v
        for k, v in context.items()
        if k not in spec.args and (accepted is None or k in accepted)
    }
    return registries["pack"].make(spec, **extra)


def schedule_function(spec: Spec | str | dict[str, Any]) -> Callable[[int], float]:
    """The learning rate of an iteration that ``spec`` names: the registered schedule
    ``fn(iteration, **args)`` with the spec's args; called once now (iteration 0), so that
    bad arguments show when the config is read."""
    spec = Spec.of(spec, "schedule")
    fn = registries["schedule"].get(spec.type_)
    lr_at = functools.partial(fn, **spec.args) if spec.args else fn
    try:
        lr_at(0)
    except TypeError as error:
        raise TypeError(
            f"schedule {spec.type_!r} ({_place(fn)}) could not be called as "
            f"fn(iteration, **{spec.args!r}): {error}"
        ) from error
    return lr_at


def _is_lr_schedule(factory: Callable[..., Any]) -> bool:
    from ..packs.lr_schedule import LRSchedule

    return inspect.isclass(factory) and issubclass(factory, LRSchedule)


def make_optimizer(
    spec: Spec | str | dict[str, Any],
    parameters: Iterable[Any] | torch.nn.Module,
    *,
    check_names: bool = True,
) -> Any:
    """Build a registered optimizer over ``parameters``, or over a module's: with the
    spec's ``no_decay`` or ``lr_scale`` (``GROUP_ARGS``), over its param groups
    (``runmodel.param_groups``: no weight decay on the names ``no_decay`` lists, the lr
    scaled by ``lr_scale``'s factors), which needs the module."""
    spec = Spec.of(spec, "optimizer")
    grouping = {k: v for k, v in spec.args.items() if k in GROUP_ARGS}
    if not grouping:
        if isinstance(parameters, torch.nn.Module):
            parameters = parameters.parameters()
        return registries["optimizer"].make(spec, parameters)
    from ..models.param_groups import param_groups

    args = {k: v for k, v in spec.args.items() if k not in GROUP_ARGS}
    if not isinstance(parameters, torch.nn.Module):
        raise TypeError(
            f"the optimizer {spec.type_!r} with {' and '.join(grouping)} groups the "
            f"parameters by name: build it over the module (make_optimizer(spec, module))"
        )
    if not check_names:  # a stand-in module: the names are the run's module's
        grouping.pop("lr_scale", None)
    groups = param_groups(
        parameters, weight_decay=args.get("weight_decay", 0.0), lr=args.get("lr"), **grouping
    )
    return registries["optimizer"].make(Spec(spec.type_, args), groups)


def make_loss(spec: Spec | str | dict[str, Any]) -> Any:
    return registries["loss"].make(spec)


def _accepted(factory: Callable[..., Any]) -> set[str] | None:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


_builtins_loaded: list[bool] = []  # one element once they are (a registration in it asks)


def _load_builtins() -> None:
    """Register torch's optimizers and losses and runmodel's own interfaces, backends and
    packs, once, on first use."""
    if _builtins_loaded:
        return
    _builtins_loaded.append(True)
    for kind, table in builtins.BUILTINS.items():
        for name, factory in table.items():
            registries[kind].register(name, factory)
