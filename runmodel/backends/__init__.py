"""Backends prepare a model and its optimizer for a run: ``initialize(model, spec)``."""

from __future__ import annotations

from ..core import FineTuneSpec
from .amp import AMP
from .base import Backend, OptimizerFactory, Plain
from .compile import Compile
from .distributed import DDP, FSDP

__all__ = ["AMP", "BACKEND_TYPES", "DDP", "FSDP", "Backend", "Compile", "FineTuneSpec",
           "OptimizerFactory", "Plain"]

#: The built-in backends by name (``runmodel.register_backend`` adds others).
BACKEND_TYPES: dict[str, type[Backend]] = {"plain": Plain, "amp": AMP, "compile": Compile,
                                           "ddp": DDP, "fsdp": FSDP}
