"""``torch.compile`` the model's module."""

from __future__ import annotations

from typing import Any

import torch

from ..core import RunHorizon
from ..models import unwrap
from .base import Backend

__all__ = ["Compile"]


class Compile(Backend):
    """Replaces ``model.module`` with ``torch.compile(module, **options)`` (parameters are
    shared, so the optimizer stays valid; checkpoints store the original module's keys).
    ``backend="eager"`` checks the wiring without compiling."""

    def __init__(
        self,
        mode: str | None = None,
        backend: str = "inductor",
        fullgraph: bool = False,
        dynamic: bool | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.compile_options: dict[str, Any] = {
            "mode": mode,
            "backend": backend,
            "fullgraph": fullgraph,
            "dynamic": dynamic,
        }

    def initialize(self, model: Any, spec: RunHorizon) -> None:
        super().initialize(model, spec)
        if getattr(model, "module", None) is None:
            raise ValueError(f"the compile backend needs {type(model).__name__}.module")
        # the original module: a model compiled by an earlier run is compiled afresh
        model.module = torch.compile(unwrap(model.module), **self.compile_options)
