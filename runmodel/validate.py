"""What a hook registration may say: every check made at registration, not at run time.

Each error says what was wrong and what would be right.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from types import CodeType
from typing import Any

from .phases import MODES, PHASES

__all__ = ["ARGS", "check_phase", "check_signature", "code_of", "describe_fn", "modes_of",
           "names_of", "ranks_of", "source_of"]

#: What a hook (False) and an override (True) are called with.
ARGS = {False: ("engine",), True: ("engine", "default")}

def check_phase(phase: object, *, override: bool) -> str:
    if not isinstance(phase, str) or phase not in PHASES:
        valid = [p for p, spec in PHASES.items() if spec.has_action or not override]
        close = difflib.get_close_matches(str(phase), valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown phase {phase!r}.{hint} Valid phases: {', '.join(valid)}")
    if override and not PHASES[phase].has_action:
        with_action = [p for p, spec in PHASES.items() if spec.has_action]
        raise ValueError(f"phase {phase!r} has no action to override; phases with an "
                         f"action: {', '.join(with_action)}. Use engine.on({phase!r}) for a hook")
    return phase


def check_signature(fn: Callable[..., Any], args: tuple[str, ...], what: str) -> None:
    """``fn`` must accept exactly the positional ``args`` it will be called with."""
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {type(fn).__name__} {fn!r}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature; trust them
        return
    try:
        sig.bind(*args)
    except TypeError:
        raise TypeError(f"{what} {describe_fn(fn)} has signature {sig}, but it is called "
                        f"as fn({', '.join(args)})") from None


def _items(value: object, option: str, wanted: str) -> tuple[Any, ...]:
    if isinstance(value, (str, int)):
        return (value,)
    if isinstance(value, (list, tuple, set, frozenset)):
        return tuple(value)
    raise TypeError(f"{option}= takes {wanted}, got {value!r}")


def names_of(value: str | Iterable[str] | None, option: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = _items(value, option, "a hook name or a list of names")
    if not items or not all(isinstance(v, str) and v for v in items):
        raise TypeError(f"{option}= takes a hook name or a list of names, got {value!r}")
    return items


def modes_of(value: str | Iterable[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    modes = frozenset(_items(value, "modes", f"a mode or a set of modes ({', '.join(MODES)})"))
    unknown = sorted(m for m in modes if m not in MODES)
    if unknown or not modes:
        raise ValueError(f"modes={value!r}: unknown mode(s) {unknown}; valid: {', '.join(MODES)}")
    return modes


def ranks_of(value: int | Iterable[int] | None) -> frozenset[int] | None:
    if value is None:
        return None
    ranks = _items(value, "rank", "a process rank (an int >= 0) or a list of them")
    if not ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0
                            for r in ranks):
        raise ValueError(f"rank={value!r}: give a process rank (an int >= 0) or a list of them")
    return frozenset(ranks)


def describe_fn(fn: object) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return name.rpartition("<locals>.")[2]  # "main.<locals>.report" reads as "report"


def code_of(fn: object) -> CodeType | None:
    """The code object that runs when ``fn`` is called, where there is one."""
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(target, "__code__", None)
    if code is None and callable(target):
        code = getattr(type(target).__call__, "__code__", None)
    return code


def source_of(fn: Callable[..., Any]) -> str:
    code = code_of(fn)
    return "?" if code is None else f"{code.co_filename}:{code.co_firstlineno}"
