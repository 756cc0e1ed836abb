"""Checkpoints: the file format on plain values (``format``), how checkpoints are named
and found (``names``), writing them in the background (``writer``), the storage a run
gets from its backend (``storage``: plain files, or ``sharded`` folders under ``fsdp``),
and a checkpoint's weights as one plain file (``export``).

``runmodel.checkpoint`` keeps the documented names: ``weights``, ``load``, ``read``,
``checkpoints_in``, ``DiskFullError``... They are imported on first use, so that
``runmodel.checkpoint.names`` (how checkpoints are named and found) is read without torch,
as ``runmodel runs`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.exports import lazy_exports

__all__ = [
    "BEST_PATTERN",
    "FORMAT",
    "PATTERN",
    "DiskFullError",
    "FileStorage",
    "FormatError",
    "Storage",
    "Unreadable",
    "Writer",
    "check_same_optimizer",
    "checkpoints_in",
    "load",
    "qualified_name",
    "read",
    "rng_state",
    "run_of",
    "save",
    "set_rng_state",
    "weights",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DiskFullError": "runmodel._io",
        **dict.fromkeys(
            (
                "FORMAT",
                "FormatError",
                "check_same_optimizer",
                "load",
                "qualified_name",
                "read",
                "rng_state",
                "run_of",
                "save",
                "set_rng_state",
                "weights",
            ),
            ".format",
        ),
        **dict.fromkeys(("BEST_PATTERN", "PATTERN", "Unreadable", "checkpoints_in"), ".names"),
        **dict.fromkeys(("FileStorage", "Storage"), ".storage"),
        "Writer": ".writer",
    },
)

if TYPE_CHECKING:
    from .._io import DiskFullError
    from .format import (
        FORMAT,
        FormatError,
        check_same_optimizer,
        load,
        qualified_name,
        read,
        rng_state,
        run_of,
        save,
        set_rng_state,
        weights,
    )
    from .names import BEST_PATTERN, PATTERN, Unreadable, checkpoints_in
    from .storage import FileStorage, Storage
    from .writer import Writer
