"""Where an error was raised: a map from code objects to the hook, action or model
method they belong to, read off the traceback only when an error happens (so it costs
nothing per step)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from .describe import short_path
from .hooks import Hook
from .options import code_of

__all__ = ["Where"]


class Where:
    """Labels for code objects; several hooks may share one (closures from one factory,
    methods of two instances of one pack)."""

    def __init__(self) -> None:
        self._labels: dict[types.CodeType, list[tuple[str, Any]]] = {}

    @classmethod
    def of_run(cls, model: Any, mode: Any, backend: Any, restore: Any) -> Where:
        """Labels for what a run calls besides hooks: the model's methods, the mode's
        plan, the backend, loading a checkpoint."""
        where = cls()
        for label, fn in (
            ("model.setup", model.setup),
            ("model.run", model.run),
            ("model.teardown", model.teardown),
            ("building the mode", mode.plan),
            ("backend.initialize", getattr(backend, "initialize", None)),
            ("loading the checkpoint", restore),
        ):
            where.add(label, fn)
        return where

    def add(self, label: str, fn: Callable[..., Any] | None) -> None:
        if (code := code_of(fn)) is not None:
            entry = self._labels.setdefault(code, [])
            if (label, fn) not in entry:
                entry.append((label, fn))

    def add_hook(self, hook: Hook, kind: str) -> None:
        text = f"phase {hook.phase!r}, {kind} {hook.name!r} ({short_path(hook.source)})"
        self.add(text, hook.fn)
        self.add(f"{text}, its when= filter", hook.options.when)

    def locate(self, error: BaseException) -> str:
        """The innermost hook, action or model method the error passed through."""
        tb, found = error.__traceback__, "engine"
        while tb is not None:
            entry = self._labels.get(tb.tb_frame.f_code)
            if entry:
                # hooks sharing code: a pack method's self tells them apart
                owner = tb.tb_frame.f_locals.get("self")
                mine = [text for text, fn in entry if getattr(fn, "__self__", None) is owner]
                found = (
                    entry[0][0]
                    if len(entry) == 1
                    else mine[0]
                    if len(mine) == 1
                    else " or ".join(text for text, _ in entry)
                )
            tb = tb.tb_next
        return found
