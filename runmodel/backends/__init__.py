"""Backends prepare a model and its optimizer for a run: ``initialize(model, spec)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .amp import AMP
from .base import Backend, FineTuneSpec, Plain
from .compile import Compile

__all__ = ["AMP", "Backend", "Compile", "FineTuneSpec", "Plain", "register_builtins"]


def register_builtins(register: Callable[[str, Any], Any]) -> None:
    register("plain", Plain)
    register("amp", AMP)
    register("compile", Compile)
