"""A trained run's module as a program for deployment (``runmodel export RUN_DIR OUT
--format pt2|onnx``): ``torch.export`` or ``torch.onnx.export(dynamo=True)`` with an
example input taken from the run's data and a dynamic batch dimension, checked after the
export by running the exported program on a batch and comparing its outputs with the
module's (``torch.testing.assert_close``).

The run's model is made as its source makes it (a config, a model source or a script:
``target.run_with``), set up (``model.setup()``: its data), its chosen weights loaded
(best, else last, else the final ``model.pt``; ``averaged=True``: the average an ``EMA``
or ``SWA`` pack kept in the checkpoint), then its module is exported in eval mode. The
module's inputs are what the model's own step gives it: the arguments of the module's
first call in ``compute_output`` of the first batch (a forward pre-hook records them), so
a model with batches of another form exports as it runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils import _pytree as pytree

from .._io import atomic_write
from ..checkpoint.export import model_state
from ..engine import RunArguments
from ..extras import require
from ..models import setup_options_for
from ..models.torchutil import unwrap

__all__ = [
    "FORMATS",
    "ExportProgram",
    "Exported",
    "check_program",
    "example_inputs",
    "export_module",
    "save_pretrained",
]

#: What ``runmodel export --format`` writes: the weights (any checkpoint), or a program
#: (a run folder's model): torch.export's ``.pt2``, ONNX; or a Hugging Face model's folder
#: (``save_pretrained``: its weights and config, which ``from_pretrained`` loads).
FORMATS = ("state_dict", "pt2", "onnx", "hf")
#: The tolerances of the check, per format (ONNX Runtime's kernels are not torch's).
TOLERANCES = {
    "pt2": {"rtol": 1.3e-6, "atol": 1e-5},
    "onnx": {"rtol": 1e-4, "atol": 1e-5},
    "hf": {"rtol": 1.3e-6, "atol": 1e-5},
}


@dataclass(frozen=True)
class Exported:
    """What an export wrote and how its check went: the batch sizes it ran on, the
    largest absolute difference from the module's outputs, the tolerances it is within."""

    out: Path
    format: str
    weights: Path | None
    batch_sizes: tuple[int, ...]
    max_abs_diff: float
    rtol: float
    atol: float

    def summary(self) -> str:
        sizes = " and ".join(str(n) for n in self.batch_sizes)
        source = "the module" if self.weights is None else str(self.weights)
        loaded = (
            f"from_pretrained({self.out})'s" if self.format == "hf" else "the exported program's"
        )
        return (
            f"exported {source} as {self.format} to {self.out}\n"
            f"checked: {loaded} outputs on batches of {sizes} match the "
            f"module's (torch.testing.assert_close, rtol={self.rtol:g}, "
            f"atol={self.atol:g}): largest difference {self.max_abs_diff:.3g}"
        )


@dataclass(frozen=True)
class ExportProgram:
    """The action (``target.run_with``) that exports a run's module as ``format`` to
    ``out``, with ``weights`` loaded."""

    weights: Path
    out: Path
    format: str
    averaged: bool = False
    trains: ClassVar[bool] = False

    def __call__(self, engine: Any, model: Any, arguments: RunArguments) -> Exported:
        model.setup(setup_options_for(model, arguments.setup_options))  # as a run's
        try:
            model.load_state_dict(model_state(self.weights, averaged=self.averaged))
            return export_module(model, self.out, self.format, weights=self.weights)
        finally:
            model.teardown()


def export_module(
    model: Any, out: str | Path, format: str, weights: Path | None = None
) -> Exported:
    """Export ``model``'s module (a ``TorchModel``'s, set up: it has data) as ``format``
    (``"pt2"`` or ``"onnx"``) to ``out``, and check the program written against the
    module on a batch of its data; ``AssertionError`` (``assert_close``'s) if it differs.
    ``weights``: where the module's weights came from, for the summary."""
    if format == "hf":
        return save_pretrained(model, out, weights)
    if format not in ("pt2", "onnx"):
        raise ValueError(f"format {format!r}: a program is 'pt2' or 'onnx'")
    out = Path(out)
    if out.is_dir():  # said before any work (the write would fail only at its end)
        raise ValueError(
            f"{out} is a folder: give the program's file, such as {out / ('model.' + format)}"
        )
    if format == "onnx":
        for name in ("onnx", "onnxscript", "onnxruntime"):
            require(name, needed_by="runmodel export --format onnx")
    module = unwrap(getattr(model, "module", None))
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"export --format {format} exports a TorchModel's module; "
            f"{type(model).__name__} has none"
        )
    args, kwargs = example_inputs(model, module)
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            dynamic = _dynamic_shapes(module, args, kwargs)
            if format == "pt2":
                program = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic)
                with atomic_write(out) as file:
                    torch.export.save(program, file)
            else:
                _export_onnx(module, args, kwargs, dynamic, out)
            return check_program(module, out, format, args, kwargs, weights)
    finally:
        module.train(training)


def save_pretrained(model: Any, out: str | Path, weights: Path | None = None) -> Exported:
    """Save ``model``'s module with its own ``save_pretrained`` (a Hugging Face model: its
    weights and config) into the folder ``out``, then load it back with
    ``from_pretrained`` and compare its outputs with the module's on a batch of the
    model's data; a module without ``save_pretrained`` is refused."""
    module = unwrap(getattr(model, "module", None))
    save = getattr(module, "save_pretrained", None)
    load = getattr(type(module), "from_pretrained", None)
    if not callable(save) or not callable(load):
        raise ValueError(
            f"export --format hf saves the module with its save_pretrained (a Hugging "
            f"Face transformers model's, weights and config), and "
            f"{type(module).__name__} has none; export its weights (--format state_dict) "
            f"or a program (--format pt2 or onnx)"
        )
    assert module is not None  # it has save_pretrained
    out = Path(out)
    args, kwargs = example_inputs(model, module)
    save(out)
    loaded = load(out).to(next(module.parameters()).device)
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            return check_program(module, out, "hf", args, kwargs, weights, run=_calling(loaded))
    finally:
        module.train(training)


def _calling(module: nn.Module) -> Any:
    module.eval()

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        return [t.detach().cpu() for t in pytree.tree_leaves(module(*args, **kwargs))]

    return run


def _export_onnx(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic: Any, out: Path
) -> None:
    import logging
    import warnings

    # the exporter warns about every op set it cannot translate (torchvision's, when
    # torchvision is not installed): noise that is no fault of this module
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.onnx.export(
                module, args, kwargs=kwargs, dynamo=True, dynamic_shapes=dynamic, verbose=False
            )
    finally:
        logger.setLevel(level)
    assert program is not None  # dynamo=True returns the program
    with atomic_write(out) as file:  # one file, initializers inside (a model under 2 GB)
        file.write(program.model_proto.SerializeToString())


def example_inputs(model: Any, module: nn.Module) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments the model's step calls its module with on the first batch of its
    data (infer, else eval, else train data), at least 2 rows (a batch of 1 is repeated:
    a size of 1 would be exported as fixed)."""
    batch = _first_batch(model)
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def record(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not seen:
            seen.append((args, kwargs))

    handle = module.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            model.compute_output(model.to_device(batch))
    finally:
        handle.remove()
    if not seen:
        raise ValueError(
            f"{type(model).__name__}.compute_output(batch) did not call its "
            f"module: no example input to export with"
        )
    args, kwargs = seen[0]
    return pytree.tree_map(_two_rows, (tuple(args), dict(kwargs)))


def _first_batch(model: Any) -> Any:
    for data in (getattr(model, name, None) for name in ("infer_data", "eval_data", "train_data")):
        if isinstance(data, Iterable):
            for batch in data:
                return batch
    raise ValueError(
        f"{type(model).__name__} has no data to take an example input from "
        f"(infer_data, eval_data or train_data, set in setup())"
    )


def _two_rows(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == 1:
        return torch.cat([value, value])
    return value


def _dynamic_shapes(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """torch.export's ``dynamic_shapes``, by the name of the forward's argument each
    input binds to: the first dimension of every tensor is the batch's."""
    import inspect

    bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
    return {name: pytree.tree_map(_batch_dim, value) for name, value in bound.items()}


def _batch_dim(value: Any) -> Any:
    """A tensor's dynamic shape: its first dimension is the batch's."""
    if isinstance(value, torch.Tensor) and value.dim():
        return {0: torch.export.Dim("batch")}
    return None


def check_program(
    module: nn.Module,
    out: Path,
    format: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    weights: Path | None = None,
    *,
    run: Any = None,
) -> Exported:
    """Run the program written to ``out`` (or ``run(args, kwargs)``: its outputs) on the
    example batch and on its first half (the batch dimension is dynamic), and compare its
    outputs with the module's."""
    if run is None:
        run = _load_pt2(out) if format == "pt2" else _load_onnx(out)
    tolerance = TOLERANCES[format]
    largest, sizes = 0.0, []
    for rows in _sizes(args, kwargs):
        a, k = pytree.tree_map(lambda v, n=rows: v[:n] if _batched(v) else v, (args, kwargs))
        expected = [t.detach().cpu() for t in pytree.tree_leaves(module(*a, **k))]
        actual = [t.detach().cpu() for t in run(a, k)]
        torch.testing.assert_close(
            actual,
            expected,
            rtol=tolerance["rtol"],
            atol=tolerance["atol"],
            msg=lambda m: f"the {format} export differs from the module: {m}",
        )
        for got, wanted in zip(actual, expected, strict=True):
            largest = max(largest, float((got.float() - wanted.float()).abs().max()))
        sizes.append(rows)
    return Exported(out, format, weights, tuple(sizes), largest, **tolerance)


def _batched(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _sizes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
    rows = next(v.shape[0] for v in pytree.tree_leaves((args, kwargs)) if _batched(v))
    return [rows, max(2, rows // 2)] if rows > 2 else [rows]


def _load_pt2(out: Path) -> Any:
    program = torch.export.load(out).module()

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        return list(pytree.tree_leaves(program(*args, **kwargs)))

    return run


def _load_onnx(out: Path) -> Any:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        tensors = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        if len(tensors) != len(names):
            raise ValueError(
                f"the ONNX program takes {len(names)} inputs ({', '.join(names)}); "
                f"the module was called with {len(tensors)} tensors"
            )
        feed = {name: t.detach().cpu().numpy() for name, t in zip(names, tensors, strict=True)}
        return [torch.from_numpy(o) for o in session.run(None, feed)]

    return run
