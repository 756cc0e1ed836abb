"""The options of the ``ddp`` and ``fsdp`` backends, each declared once with what it means
and checked together when they are made: ``DDP(...)`` and ``FSDP(...)`` take them as
keyword arguments and hold them as attributes of the same names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

import torch

from ...core.checks import is_number, is_whole_number

__all__ = ["DDPOptions", "FSDPOptions"]

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


@dataclass(kw_only=True)
class DDPOptions:
    """The ``ddp`` backend's options (``fsdp`` takes them too); ``owner`` names the backend
    class in the errors (``DDP(timeout=0): ...``)."""

    owner: InitVar[str] = "DDP"
    #: torch.distributed's backend: ``"gloo"`` (CPU), ``"nccl"`` (CUDA), ``"mpi"``, or None
    #: to choose by the model's device.
    process_group: str | None = None
    #: Seconds a collective waits for a process that stopped answering without exiting
    #: (None: torch's default).
    timeout: float | None = None
    #: The training sampler's seed (None: drawn by process 0 and shared; a checkpoint
    #: keeps it).
    seed: int | None = None
    #: False leaves the model's data alone, for data each process already reads its own
    #: part of.
    shard_data: bool = True
    #: Arguments of ``DistributedDataParallel`` (``find_unused_parameters``, ...).
    ddp_options: dict[str, Any] | None = field(default_factory=dict)
    #: Seconds a process whose run ended waits for the others to end at the same step.
    end_timeout: float = 60.0
    #: Steps between the processes' checks, together, for a signal to stop at.
    preempt_check_every: int = 10

    def __post_init__(self, owner: str) -> None:
        if self.process_group not in (None, "gloo", "nccl", "mpi"):
            raise ValueError(
                f"{owner}(process_group={self.process_group!r}): give 'gloo' (CPU), 'nccl' "
                f"(CUDA), 'mpi', or None to choose by the model's device"
            )
        if self.timeout is not None and not is_number(self.timeout, above=0):
            raise ValueError(
                f"{owner}(timeout={self.timeout!r}): give seconds > 0, or None for torch's default"
            )
        if not is_number(self.end_timeout, above=0):
            raise ValueError(
                f"{owner}(end_timeout={self.end_timeout!r}): give the seconds a process "
                f"that ended waits for the others to end too (> 0)"
            )
        if not is_whole_number(self.preempt_check_every, least=1):
            raise ValueError(
                f"{owner}(preempt_check_every={self.preempt_check_every!r}): give the "
                f"number of steps between the processes' checks for a signal "
                f"to stop at (a whole number >= 1)"
            )
        if self.seed is not None and not is_whole_number(self.seed, least=None):
            raise ValueError(
                f"{owner}(seed={self.seed!r}): give a whole number, or None to draw one"
            )
        if not isinstance(self.shard_data, bool):
            raise TypeError(f"{owner}(shard_data=) takes True or False, got {self.shard_data!r}")
        if self.ddp_options is not None and not isinstance(self.ddp_options, dict):
            raise TypeError(
                f"{owner}(ddp_options=) takes a dict of DistributedDataParallel "
                f"arguments, got {self.ddp_options!r}"
            )
        self.ddp_options = dict(self.ddp_options or {})
        self.end_timeout = float(self.end_timeout)


@dataclass(kw_only=True)
class FSDPOptions:
    """The ``fsdp`` backend's own options (besides ``DDPOptions``)."""

    #: The shard units: None (each direct child of the module that holds parameters,
    #: then the root), or names of module classes or of submodules, or classes; the root
    #: is always one. Held as a list (a single one is a list of one).
    units: Sequence[str | type] | str | type | None = None
    #: Free the gathered parameters after each unit's forward (less memory, one more
    #: all-gather in backward).
    reshard_after_forward: bool = True
    #: The dtypes of a ``MixedPrecisionPolicy`` (``"bfloat16"``, ``"float16"``,
    #: ``"float32"`` or a torch dtype; None keeps the parameters' own), held as torch
    #: dtypes.
    param_dtype: Any = None
    reduce_dtype: Any = None
    #: Keep the shards on the CPU (``CPUOffloadPolicy``).
    cpu_offload: bool = False
    #: Seconds every collective of a checkpoint save or load may wait.
    checkpoint_timeout: float = 600.0

    def __post_init__(self) -> None:
        units: Any = self.units
        if isinstance(units, (str, type)):
            units = [units]
        if units is not None and (
            not isinstance(units, (list, tuple))
            or not units
            or not all(isinstance(u, (str, type)) for u in units)
        ):
            raise TypeError(
                f"FSDP(units={units!r}): give module class names, submodule names "
                f"(as named_modules() names them) or classes, or None for each "
                f"direct child that holds parameters"
            )
        self.units = None if units is None else list(units)
        if not isinstance(self.reshard_after_forward, bool):
            raise TypeError(
                f"FSDP(reshard_after_forward=) takes True or False, got "
                f"{self.reshard_after_forward!r}"
            )
        if not isinstance(self.cpu_offload, bool):
            raise TypeError(f"FSDP(cpu_offload=) takes True or False, got {self.cpu_offload!r}")
        if not is_number(self.checkpoint_timeout, above=0):
            raise ValueError(
                f"FSDP(checkpoint_timeout={self.checkpoint_timeout!r}): give the "
                f"seconds a checkpoint's collectives may wait (> 0)"
            )
        self.checkpoint_timeout = float(self.checkpoint_timeout)
        self.param_dtype = _dtype("param_dtype", self.param_dtype)
        self.reduce_dtype = _dtype("reduce_dtype", self.reduce_dtype)


def _dtype(name: str, value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        return _DTYPES[value.removeprefix("torch.")]
    raise ValueError(
        f"FSDP({name}={value!r}): give 'bfloat16', 'float16', 'float32' (or a "
        f"torch dtype), or None to keep the parameters' own"
    )
