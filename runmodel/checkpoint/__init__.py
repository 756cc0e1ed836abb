"""Checkpoints: the file format on plain values (``format``), and sharded checkpoint
folders written by every process of an ``fsdp`` run (``sharded``).

``runmodel.checkpoint`` keeps the documented names: ``weights``, ``load``, ``read``,
``checkpoints_in``, ``DiskFullError``...
"""

from __future__ import annotations

from .format import (
    BEST_PATTERN,
    FORMAT,
    PATTERN,
    DiskFullError,
    FormatError,
    Writer,
    check_same_optimizer,
    checkpoints_in,
    load,
    qualified_name,
    read,
    rng_state,
    run_of,
    save,
    set_rng_state,
    weights,
)

__all__ = ["BEST_PATTERN", "FORMAT", "PATTERN", "DiskFullError", "FormatError", "Writer",
           "check_same_optimizer", "checkpoints_in", "load", "qualified_name", "read",
           "rng_state", "run_of", "save", "set_rng_state", "weights"]
