"""``runmodel.seed(n)``: seed Python's, NumPy's and torch's random number generators, as a
config run's ``seed`` does (a config run calls it before it builds the model).

A script calls it before it builds its model, so that the initial weights (and anything
else drawn before the run) are the same each time; the seed is recorded in the run
folder's ``run.json`` of the script's runs (``"seed"``). A resumed run restores all three
generators from its checkpoint, whatever was seeded before.
"""

from __future__ import annotations

import random

import torch

from ..core.checks import is_whole_number

__all__ = ["last_seed", "seed"]

#: NumPy's global generator takes seeds below 2**32.
SEED_LIMIT = 2**32

#: The seed this process set last (one entry, or none): a run folder records it.
_seeded: list[int] = []


def seed(n: int) -> int:
    """Seed ``random``, NumPy (when installed) and torch (every device) with ``n`` (a
    whole number, 0 <= n < 2**32); returns ``n``. Call it before the model is built."""
    if not is_whole_number(n) or n >= SEED_LIMIT:
        raise ValueError(
            f"runmodel.seed(n) takes a whole number from 0 to {SEED_LIMIT - 1} "
            f"(NumPy's generator takes no larger one), got {n!r}"
        )
    random.seed(n)
    torch.manual_seed(n)  # every device's generator (CUDA's too)
    try:
        import numpy
    except ImportError:  # NumPy is torch's optional dependency: nothing of it to seed
        pass
    else:
        numpy.random.seed(n)
    _seeded[:] = [n]
    return n


def last_seed() -> int | None:
    """The seed ``seed`` set last in this process (None: it was never called)."""
    return _seeded[-1] if _seeded else None
