"""A checkpoint's model weights as one plain file (``runmodel export``), and a trained
model's state from whatever holds it (``runmodel eval``/``infer``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write
from .format import FormatError, load_values
from .format import read as read_file
from .names import Unreadable, first_readable, is_sharded
from .sharded.loading import read_whole

__all__ = ["AVERAGED", "averaged_weights", "export", "model_state", "module_weights"]

#: The key, in the state of a weight-averaging pack (``EMA``, ``SWA``), of the averaged
#: module's state dict: what ``averaged=True`` reads from a checkpoint.
AVERAGED = "averaged_module"


def export(
    path: str | os.PathLike[str], out: str | os.PathLike[str], *, averaged: bool = False
) -> tuple[Path, Path]:
    """Write the full model state dict of the checkpoint at ``path`` to ``out``, one
    plain ``torch.save`` file that ``torch.load(weights_only=True)`` loads into the bare
    module. ``path`` is a checkpoint file, a sharded checkpoint folder, or a folder of
    checkpoints (a Checkpoint pack's, or a run folder's): its newest readable one.
    ``averaged=True``: the averaged weights an ``EMA`` or ``SWA`` pack kept in it instead.
    Returns the checkpoint used and ``out``."""
    path, out = Path(path), Path(out)
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r}: no such checkpoint file or folder")
    if out.is_dir():
        raise IsADirectoryError(
            f"{str(out)!r} is a folder: the export is one file; give a "
            f"file path, such as {str(out / 'model.pt')!r}"
        )
    used, state = first_readable(
        path, averaged_weights if averaged else module_weights, doing="export"
    )
    with atomic_write(out) as file:
        torch.save(state, file)
    return used, out


def module_weights(checkpoint: Path) -> dict[str, Any]:
    """The module's full state dict (whole tensors) in a checkpoint file or a sharded
    checkpoint folder; ``Unreadable`` where it cannot be read."""
    try:
        if is_sharded(checkpoint):  # read whole, in this one process
            weights: dict[str, Any] = read_whole(checkpoint, optimizer=False)["module"]
            return weights
        model = read_file(checkpoint).get("model")
    except (Unreadable, FormatError):
        raise
    except Exception as error:  # a sharded one's unsafe or damaged index, shards
        why = f"{type(error).__name__}: {error}"
    else:
        module = model.get("module") if isinstance(model, dict) else None
        if not isinstance(module, dict):
            raise Unreadable(
                checkpoint, "it holds no module weights (a model without a module state)"
            )
        return {
            key: value.detach().clone() if isinstance(value, torch.Tensor) else value
            for key, value in module.items()
        }
    raise Unreadable(checkpoint, why) from None  # one error: nothing chained, no context


def averaged_weights(checkpoint: Path) -> dict[str, Any]:
    """The averaged module weights that a weight-averaging pack (``EMA``, ``SWA``) kept in
    a checkpoint file; ``Unreadable`` where the file cannot be read, ``ValueError`` where
    it holds none (or the packs of two averages, naming them)."""
    if is_sharded(checkpoint):
        raise ValueError(
            f"{str(checkpoint)!r} is a sharded checkpoint: it holds no averaged "
            f"weights (EMA and SWA are refused under fsdp)"
        )
    try:
        packs = read_file(checkpoint).get("engine", {}).get("packs", {})
    except Unreadable as error:
        if not error.foreign:
            raise
        raise ValueError(
            f"{str(checkpoint)!r} is no checkpoint (the module's weights alone, "
            f"as a run's model.pt or an export): averaged weights are kept in "
            f"checkpoints; attach a Checkpoint pack to the run"
        ) from None
    found = {
        key: state[AVERAGED]
        for key, state in packs.items()
        if isinstance(state, dict)
        and isinstance(state.get(AVERAGED), dict)
        and int(state.get("n_averaged", 0)) > 0
    }  # 0: a copy, nothing averaged yet
    if len(found) != 1:
        raise ValueError(
            f"{str(checkpoint)!r} holds "
            + (
                "no averaged weights (its run had no EMA or SWA pack, or saved it before the "
                "average began)"
                if not found
                else f"the averaged weights of {len(found)} packs ({', '.join(map(repr, found))}); "
                f"export each pack's from Python"
            )
        )
    weights = next(iter(found.values()))
    return {
        key: value.detach().clone() if isinstance(value, torch.Tensor) else value
        for key, value in weights.items()
    }


def model_state(path: str | os.PathLike[str], *, averaged: bool = False) -> Any:
    """The model's state to evaluate with, its optimizer left out (``"optimizer": None``),
    from a checkpoint file, a sharded checkpoint folder (read whole) or a file of the
    module's weights alone (an export, a ``model.pt``). A file that is none of them is
    one ``ValueError`` naming it and what is wrong with it. ``averaged=True``: the
    averaged weights an ``EMA`` or ``SWA`` pack kept in the checkpoint."""
    path = Path(path)
    if averaged:
        return {"module": averaged_weights(path), "optimizer": None}
    if is_sharded(path):
        return {"module": module_weights(path), "optimizer": None}
    try:
        state = read_file(path).get("model")
    except Unreadable as error:
        if not error.foreign:
            raise
        return {"module": load_values(path), "optimizer": None}  # the weights alone
    if state is None:
        raise ValueError(f"{str(path)!r} holds no model weights")
    if isinstance(state, dict) and "optimizer" in state:
        return {**state, "optimizer": None}
    return state
