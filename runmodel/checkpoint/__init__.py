"""Checkpoints: the file format on plain values (``format``), how checkpoints are named
and found (``names``), writing them in the background (``writer``), the storage a run
gets from its backend (``storage``: plain files, or ``sharded`` folders under ``fsdp``),
and a checkpoint's weights as one plain file (``export``).

``runmodel.checkpoint`` keeps the documented names: ``weights``, ``load``, ``read``,
``checkpoints_in``, ``DiskFullError``... They are imported on first use, so that
``runmodel.checkpoint.names`` (how checkpoints are named and found) is read without torch,
as ``runmodel runs`` does.
"""

# The imports under TYPE_CHECKING name the exports for type checkers; lazy_exports builds
# __all__ (tests/test_exports.py checks that the two agree).
# ruff: noqa: F401

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
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
