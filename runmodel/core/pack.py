"""Packs: reusable bundles of hooks with their own state, and the decorators that mark
a pack's methods as hooks or overrides."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .filters import check_unit
from .hooks import Hook
from .options import ARGS, HookOptions, check_phase, check_signature
from .phases import PHASES

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .options import HookArgs

__all__ = [
    "Pack",
    "attach_site",
    "check_repeats",
    "flatten_packs",
    "hook",
    "override",
    "steps_per_iteration",
]

_MARK = "__runmodel_hooks__"


def _mark(phase: str | None, override: bool, options: HookOptions) -> Callable[[Any], Any]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        target = check_phase(phase or getattr(fn, "__name__", None), override=override)
        check_signature(fn, ("self", *ARGS[override]), "a pack method")
        if options.every is not None:
            check_unit(target, options.every, "every")
        fn.__dict__.setdefault(_MARK, []).append((target, override, options))
        return fn

    return decorate


def hook(phase: str | None = None, **options: Unpack[HookArgs]) -> Callable[[Any], Any]:
    """Set a pack method's hook options (``priority``, ``every``, ``before``, ...).

    A method named after a phase is a hook already; ``phase=`` lets a method of any
    name hook a phase. Decorating twice hooks the method on two phases. The options are
    checked here, when the class is defined.
    """
    return _mark(phase, False, HookOptions.of(**options))


def override(phase: str, **options: Unpack[HookArgs]) -> Callable[[Any], Any]:
    """Make a pack method ``(self, engine, default)`` an override of ``phase``'s action."""
    return _mark(phase, True, HookOptions.of(**options))


class Pack:
    """A reusable bundle of hooks with its own state.

    Methods named after phases are hooks; ``@runmodel.hook(...)`` and
    ``@runmodel.override(...)`` mark others or set options. A pack whose hooks depend on
    its arguments (a checkpoint interval, say) overrides ``hooks()`` and yields
    ``runmodel.Hook(self.method, phase, HookOptions.of(...))``. Packs held in attributes
    (directly or in a list or tuple) are attached and detached with their holder.
    ``state_dict``/``load_state_dict`` are saved in checkpoints. ``reads``/``writes``
    declare the metrics it reads and writes; ``check_setup`` refuses a run that cannot
    work, before it begins.
    """

    name: str | None = None
    #: The metrics (keys of ``state.metrics``) this pack's hooks read and write. At setup
    #: the engine compares every name read with the names written (by packs, hooks'
    #: ``writes=`` and the step): a read name a typo away from a written one stops the
    #: run. Class attributes, or set in ``__init__`` when they depend on the arguments, or
    #: in ``check_setup`` when they depend on the model (``docs/writing_packs.md``).
    reads: Collection[str] = ()
    writes: Collection[str] = ()
    #: Whether two packs of this very class may be attached to one engine. A pack that
    #: changes the training (a schedule, clipping, accumulation) says False: a second one
    #: would compound the first (attached twice by mistake: by a config and by a model
    #: file's ``configure``), and attaching it is refused, naming both places.
    repeatable: bool = True

    def hooks(self) -> Iterator[Hook]:
        """This pack's own hooks (not its children's), in definition order; a subclass's
        definition of a name (and its options) replaces its bases'."""
        names: dict[str, None] = {}  # first definition, bases first: the order
        for cls in reversed(type(self).__mro__):
            names.update(dict.fromkeys(a for a in vars(cls) if not a.startswith("__")))
        for attr in names:
            value = next(vars(c)[attr] for c in type(self).__mro__ if attr in vars(c))
            marks = getattr(value, _MARK, None)
            if marks is None and attr in PHASES and callable(value):
                marks = [(attr, False, HookOptions())]
            for phase, is_override, options in marks or ():
                yield Hook(getattr(self, attr), phase, options, override=is_override)

    def children(self) -> list[Pack]:
        """Packs this one holds: attributes that are packs, or lists/tuples of packs."""
        found: list[Pack] = []
        for value in vars(self).values():
            items = value if isinstance(value, (list, tuple)) else (value,)
            found.extend(v for v in items if isinstance(v, Pack))
        return found

    def check_setup(self, engine: Any) -> None:
        """Refuse a run that cannot work, before it begins: called once a run, after
        ``model.setup()``, the backend and the checkpoint read (``engine.state`` holds
        the resumed counters), before the ``setup`` hooks and before any pack writes a
        file. Raise one error that says what is wrong and what would be right; the run
        then ends with ``model.teardown()`` alone (and the backend's own cleanup): no
        ``exception`` or ``teardown`` hook runs, since none saw the run begin.

        Every setup-time check of a pack lives here: folders it cannot write, metrics it
        reads that nothing declares, a checkpoint that does not fit. Not a phase: a pack
        hook, not filtered, in attach order."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this pack; empty unless the pack has state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


def pack_hooks(pack: Pack) -> list[Hook]:
    """``pack.hooks()``, each owned by the pack and named ``Pack.method`` unless named."""
    label = pack.name or type(pack).__name__
    hooks = []
    for h in pack.hooks():
        if not isinstance(h, Hook):
            raise TypeError(
                f"{type(pack).__name__}.hooks() yielded {h!r}; yield "
                f"runmodel.Hook(fn, phase, options) records"
            )
        h.pack = pack
        if h.options.name is None:
            h.name = f"{label}.{getattr(h.fn, '__name__', h.name)}"
        hooks.append(h)
    return hooks


def flatten_packs(packs: Iterable[Pack], taken: set[str]) -> list[tuple[str, Pack]]:
    """Packs and the packs they hold, depth first, each with its key: its name (``name``
    or the class name) under its parent's (``Outer/Inner``), ``#2``... where ``taken``
    or an earlier pack has it already."""
    flat: list[tuple[str, Pack]] = []

    def visit(pack: Pack, parent: str | None) -> None:
        if not isinstance(pack, Pack):
            raise TypeError(
                f"attach() takes Pack instances, got {type(pack).__name__} "
                f"{pack!r}; for a function use engine.on(phase, fn)"
            )
        name = pack.name or type(pack).__name__
        key = base = name if parent is None else f"{parent}/{name}"
        for n in itertools.count(2):
            if key not in taken:
                break
            key = f"{base}#{n}"
        taken.add(key)
        flat.append((key, pack))
        for child in pack.children():
            visit(child, key)

    for pack in packs:
        visit(pack, None)
    return flat


_CORE = os.path.dirname(os.path.abspath(__file__))
_FACADE = os.path.join(os.path.dirname(_CORE), "engine.py")


def steps_per_iteration(packs: Iterable[Pack]) -> int:
    """The steps one optimizer step takes: a pack's ``steps_per_iteration``
    (``GradAccumulation(k)``'s ``k``), else 1."""
    return max((getattr(p, "steps_per_iteration", 1) for p in packs), default=1)


def attach_site() -> str:
    """``file:line`` of the code that attached packs: the innermost caller outside the
    engine (``runmodel/core/`` and the ``runmodel.Engine`` facade)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not (path.startswith(_CORE + os.sep) or path == _FACADE):
            return f"{_relative(path)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def _relative(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if relative.startswith("..") else relative


def check_repeats(
    new: list[tuple[str, Pack]], attached: dict[str, Pack], sites: dict[int, str], site: str
) -> None:
    """Refuse a pack whose class is not ``repeatable`` when a pack of that very class is
    attached already (``attached``, each attached at ``sites[id(pack)]``) or comes earlier
    among ``new`` (attached here, at ``site``), naming both places."""
    seen: dict[type, tuple[str, str]] = {
        type(p): (k, sites.get(id(p), "?")) for k, p in attached.items() if not p.repeatable
    }
    for key, pack in new:
        kind = type(pack)
        if kind.repeatable:
            continue
        if kind in seen:
            first_key, first_site = seen[kind]
            raise ValueError(
                f"two {kind.__name__} packs on one engine: {first_key!r} attached at "
                f"{first_site}, and {key!r} at {site}. A second {kind.__name__} would "
                f"compound the first (a config's packs and a model file's configure(engine) "
                f"both attaching one?); attach one, or detach the first "
                f"({kind.__name__}.repeatable is False)"
            )
        seen[kind] = (key, site)
