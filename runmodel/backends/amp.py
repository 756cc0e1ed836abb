"""Automatic mixed precision: autocast around forward; a GradScaler for float16."""

from __future__ import annotations

from typing import Any

import torch

from ..core import Pack, RunHorizon, override
from .base import Backend

__all__ = ["AMP"]


class AMP(Backend):
    """Autocast in ``dtype`` (default: bfloat16 on the CPU, float16 on CUDA); with
    float16 on CUDA, the loss is scaled by a ``torch.amp.GradScaler``, whose state is
    kept in checkpoints. Its overrides are innermost (priority -100), so gradient
    accumulation or clipping overrides wrap them."""

    def __init__(self, dtype: str | None = None, **options: Any) -> None:
        super().__init__(**options)
        if dtype is not None and dtype not in ("bfloat16", "float16"):
            raise ValueError(f"AMP dtype must be 'bfloat16' or 'float16', got {dtype!r}")
        self.dtype = dtype
        self._pack: Pack | None = None

    def initialize(self, model: Any, spec: RunHorizon) -> None:
        super().initialize(model, spec)
        device = getattr(model, "device", torch.device("cpu"))
        device_type = device.type if isinstance(device, torch.device) else str(device)
        dtype = getattr(torch, self.dtype or ("float16" if device_type == "cuda" else "bfloat16"))
        if dtype is torch.float16 and device_type == "cuda":
            self._pack = ScaledAutocast(device_type, dtype)
        else:
            self._pack = Autocast(device_type, dtype)

    def pack(self) -> Pack | None:
        return self._pack


class Autocast(Pack):
    name = "amp"

    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        self.device_type, self.dtype = device_type, dtype

    @override("forward", priority=-100)
    def autocast_forward(self, engine: Any, default: Any) -> None:
        with torch.autocast(self.device_type, dtype=self.dtype):
            default(engine)


class ScaledAutocast(Autocast):
    """Autocast, and a GradScaler that scales the loss in backward and steps the model's
    optimizer (read at each step); ``engine.state.grad_scaler`` holds it, so that packs
    which read gradients unscale them first."""

    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        super().__init__(device_type, dtype)
        self.scaler = torch.amp.GradScaler(device_type)

    def setup(self, engine: Any) -> None:
        engine.state.grad_scaler = self.scaler

    @override("backward", priority=-100)
    def scaled_backward(self, engine: Any, default: Any) -> None:
        loss = engine.state.loss
        engine.state.loss = self.scaler.scale(loss)
        try:
            default(engine)
        finally:
            engine.state.loss = loss  # hooks see the true loss

    @override("optimizer_step", priority=-100)
    def scaled_step(self, engine: Any, default: Any) -> None:
        optimizer = engine.model.optimizer
        self.scaler.step(optimizer)
        self.scaler.update()
        optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scaler" in state:  # a checkpoint of a run without a scaler starts a fresh one
            self.scaler.load_state_dict(state["scaler"])
