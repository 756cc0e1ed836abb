"""Backends prepare a model and its optimizer for a run: ``initialize(model, spec)``.

The names below are imported on first use, so that ``runmodel.backends.distributed.env``
(where this process stands among a distributed run's) is read without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.exports import lazy_exports

__all__ = [
    "AMP",
    "BACKEND_TYPES",
    "DDP",
    "FSDP",
    "Backend",
    "Compile",
    "OptimizerFactory",
    "Plain",
    "RunHorizon",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AMP": ".amp",
        "BACKEND_TYPES": ".by_name",
        **dict.fromkeys(("Backend", "OptimizerFactory", "Plain"), ".base"),
        "Compile": ".compile",
        **dict.fromkeys(("DDP", "FSDP"), ".distributed"),
        "RunHorizon": "runmodel.core",
    },
    deprecated={"FineTuneSpec": "runmodel.core.RunHorizon"},
)

if TYPE_CHECKING:
    from ..core import RunHorizon
    from .amp import AMP
    from .base import Backend, OptimizerFactory, Plain
    from .by_name import BACKEND_TYPES
    from .compile import Compile
    from .distributed import DDP, FSDP

    FineTuneSpec = RunHorizon  # deprecated (docs/changelog.md)
