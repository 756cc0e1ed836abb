"""What ``NaNGuard`` and ``SpikeGuard`` share: one verdict for every process, the run
folder's ``divergence.json``, and the replay of a failed step that names the module
where a non-finite value starts.

The replay costs nothing until a check fails. When one does, the step's state before
its update is all still there: the optimizer has not stepped (the guards check after
backward), the batch is ``state.batch``; what the replay changes (gradients, buffers such
as batch norm's running statistics, the random generators) is put back as it was, so a
run with ``locate=True`` ends with the weights of a run without it. Only the random
generators' states from before the step are gone by then: ``Generators``, taken at every
step's start (``locate="exact"``), keeps them for the replay to start from."""

from __future__ import annotations

import json
import random
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write
from ..core import Pack, override
from ..models.torchutil import unwrap
from ._common import zero_grads

__all__ = [
    "FILE",
    "TRAIN_MODES",
    "Finding",
    "Generators",
    "StepGuard",
    "agreed_failure",
    "locate",
    "record",
    "world",
]

#: The run folder's file of divergences: a JSON list of records, oldest first.
FILE = "divergence.json"
#: The modes whose steps may be train steps (benchmark and profile can measure them).
TRAIN_MODES = ("train", "benchmark", "profile")


# -- one verdict for every process ---------------------------------------------------------


class StepGuard(Pack):
    """What ``NaNGuard`` and ``SpikeGuard`` share: a check after the backward pass finds
    the step bad (``_found``, what it found), and then the optimizer step is not taken
    and the step's gradients are dropped."""

    _found: str | None = None

    @override("optimizer_step", priority=200, modes=TRAIN_MODES)
    def guard(self, engine: Any, default: Callable[[Any], Any]) -> None:
        """Step, unless this step (or window) was found bad."""
        if self._found is None:
            default(engine)
            return
        self._found = None
        self._dropped()
        zero_grads(engine.model)

    def _dropped(self) -> None:
        """An optimizer step was not taken (what a guard counts)."""


def world() -> int:
    """The number of processes of the run: torch.distributed's world once it is set up."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def agreed_failure(ok: torch.Tensor | bool, rank: int, processes: int) -> int | None:
    """``None`` when the check passed on every process, else the rank of a process where
    it failed (the highest). Alone: one read of ``ok``; among ``processes`` > 1: one
    all-reduce of one number (each process's rank + 1 where it failed, else 0), so every
    process takes the same decision at the same step (``ok`` a tensor on the device the
    process group's backend reduces on; a bool, on the CPU)."""
    if processes == 1:
        return None if bool(ok) else rank
    import torch.distributed as dist

    verdict = ok if isinstance(ok, torch.Tensor) else torch.tensor(ok)
    local = getattr(verdict, "to_local", None)  # fsdp: a verdict on this process's shards
    if callable(local):
        verdict = local()
    failed = torch.where(verdict, 0, rank + 1).to(torch.int32).reshape(1)
    if dist.get_backend() == "gloo" and failed.device.type != "cpu":
        failed = failed.cpu()
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    highest = int(failed.item())
    return highest - 1 if highest else None


# -- the record ----------------------------------------------------------------------------


def record(engine: Any, entry: dict[str, Any]) -> dict[str, Any]:
    """Add ``entry`` (with the step's counters first) to the run folder's
    ``divergence.json`` (when the run has a folder; a process other than rank 0 writes
    ``divergence.rank<N>.json``) and make it ``engine.state.divergence``. A record of
    the same step (and batch) from the same guard replaces the older one: a resumed run
    that repeats a finding repeats its record, not the list."""
    s = engine.state
    entry = {"step": s.step, "epoch": s.epoch, "epoch_step": s.epoch_step, **entry}
    s.divergence = entry
    folder = getattr(engine.table.packs.get("run_folder"), "directory", None)
    if isinstance(folder, Path) and folder.is_dir():
        name = FILE if s.rank == 0 else f"divergence.rank{s.rank}.json"
        path = folder / name
        try:
            records = json.loads(path.read_text()) if path.is_file() else []
        except (OSError, ValueError):
            records = []  # a torn or foreign file: the run's own records start it again

        def key(r: dict[str, Any]) -> tuple[Any, ...]:  # a rollback's: also its batch
            return (r.get("step"), r.get("guard"), r.get("batch"))

        records = [r for r in records if key(r) != key(entry)] + [entry]
        with atomic_write(path, "w") as file:
            json.dump(records, file, indent=1)
    return entry


# -- the replay ----------------------------------------------------------------------------


class Finding(dict[str, Any]):
    """Where a non-finite value starts: ``module`` (a dotted path as ``named_modules()``
    gives it; ``""`` for the model's module itself), ``phase`` (``forward``, ``backward``,
    or the name of the hook or override that made it), ``shape``, ``dtype`` and ``how``
    (the words of the line on stderr)."""


class Generators:
    """The states of the random generators a step draws from, as they are now: torch's
    on the CPU and on each CUDA device (once CUDA is initialized), Python's ``random``
    and NumPy's global one (once ``numpy.random`` is imported). The cheap form of
    ``core.snapshot.rng_state``: each kept as its generator gives it, not made into
    tensors for a checkpoint, for ``put_back`` in this process only."""

    __slots__ = ("cuda", "numpy", "python", "torch")

    def __init__(self) -> None:
        self.torch = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.python = random.getstate()
        numpy_random = sys.modules.get("numpy.random")
        self.numpy = numpy_random.get_state() if numpy_random is not None else None

    def put_back(self) -> None:
        """Set every generator to the state it had when this was taken."""
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy.random"].set_state(self.numpy)


def locate(engine: Any, start: Generators | None = None) -> Finding | None:
    """Run the current step again from its state before the update, with forward and
    full backward hooks on every module (and on the loss function when it is a module),
    and say where the first non-finite value appears; ``None`` when the replay stays
    finite and no hook or override of the step can be blamed. The replay draws its
    random numbers from ``start`` (the generators' states when the step began), or
    without it from where the step left them. Everything the replay touches is put
    back, the generators where the step left them."""
    model = engine.model
    wrapped = getattr(model, "module", None)
    module = unwrap(wrapped)
    if not isinstance(module, torch.nn.Module) or any(
        hasattr(p, "to_local") for p in module.parameters()
    ):  # sharded (fsdp): a replay's collectives would need every process to take its path
        return None
    bad_input = next((t for t in _tensors(engine.state.batch) if not _finite(t)), None)
    if bad_input is not None:
        return _finding("", "batch", bad_input, "the step's batch holds NaN or inf")
    names = {id(m): name for name, m in module.named_modules()}
    bad_weight = _first_bad(module.named_parameters())
    if bad_weight is not None:  # the step began with them: an earlier update made them
        name, p = bad_weight
        owner, _, _ = name.rpartition(".")
        culprits = _users(engine, "optimizer_step") or ["the optimizer's step"]
        return _finding(
            owner,
            culprits[0],
            p,
            f"parameter {name!r} held NaN or inf when the step began: made by the update "
            f"of an earlier step ({', '.join(culprits)})",
        )
    hooked = list(module.modules())
    loss_fn = getattr(model, "loss_fn", None)
    if isinstance(loss_fn, torch.nn.Module) and id(loss_fn) not in names:
        names[id(loss_fn)] = "loss_fn"
        hooked.append(loss_fn)
    try:
        found, loss = _replay(engine, wrapped, module, hooked, names, start, modules_backward=True)
    except RuntimeError:  # a module changed its input in place: no full backward hooks
        found, loss = _replay(engine, wrapped, module, hooked, names, start, modules_backward=False)
    if found:
        return found[0]
    phase = "forward" if not _finite(engine.state.loss) else "backward"
    culprits = _users(engine, phase)
    if culprits and isinstance(loss, torch.Tensor):
        return _finding(
            "",
            culprits[0],
            loss,
            f"the step's {phase} action gives finite values when run alone: made by "
            f"{', '.join(culprits)}",
        )
    return None


def _replay(
    engine: Any,
    wrapped: Any,
    module: torch.nn.Module,
    hooked: list[torch.nn.Module],
    names: dict[int, str],
    start: Generators | None,
    modules_backward: bool,
) -> tuple[list[Finding], Any]:
    """The step's forward and backward again (from the generators' states ``start``,
    when given), with hooks that note each non-finite value where it appears
    (``modules_backward``: full backward hooks on the modules, beside the parameters'
    gradient hooks); what it found, first first, and its loss."""
    model = engine.model
    found: list[Finding] = []
    with _restored(module, start), _alone(model, wrapped, module), ExitStack() as hooks:
        for m in hooked:
            hooks.callback(m.register_forward_hook(_on_forward(names, found)).remove)
            if modules_backward:
                hooks.callback(m.register_full_backward_hook(_on_backward(names, found)).remove)
        for name, p in module.named_parameters():
            if p.requires_grad:
                hooks.callback(p.register_post_accumulate_grad_hook(_on_grad(name, found)).remove)
        interface = model.interface
        with torch.enable_grad(), warnings.catch_warnings():
            # the first module's inputs need no gradient: its hook sees its outputs' only
            warnings.filterwarnings("ignore", "Full backward hook is firing")
            _output, loss = interface.forward(model, engine.state.batch)
            if isinstance(loss, torch.Tensor) and loss.requires_grad:
                interface.backward(model, loss)
    return found, loss


def _on_forward(names: dict[int, str], found: list[Finding]) -> Callable[..., None]:
    def hook(m: torch.nn.Module, args: Any, output: Any) -> None:
        if found:
            return
        bad = next((t for t in _tensors(output) if not _finite(t)), None)
        if bad is None:
            return
        name = names.get(id(m), "")
        if all(_finite(t) for t in _tensors(args)):
            how = f"its forward returned NaN or inf from finite inputs ({type(m).__name__})"
            found.append(_finding(name, "forward", bad, how))
        else:  # made between modules, in the forward code of the one that calls it
            caller = name.rpartition(".")[0]
            how = (
                f"the forward code of {caller or 'the model'} made NaN or inf "
                f"before it called {name}"
            )
            found.append(_finding(caller, "forward", bad, how))

    return hook


def _on_backward(names: dict[int, str], found: list[Finding]) -> Callable[..., None]:
    def hook(m: torch.nn.Module, grad_input: Any, grad_output: Any) -> None:
        if found or not all(_finite(t) for t in _tensors(grad_output)):
            return
        bad = next((t for t in _tensors(grad_input) if not _finite(t)), None)
        if bad is not None:
            how = (
                f"the gradient flowing out of it ({type(m).__name__}) became NaN or inf "
                f"from a finite one"
            )
            found.append(_finding(names.get(id(m), ""), "backward", bad, how))

    return hook


def _on_grad(name: str, found: list[Finding]) -> Callable[[torch.Tensor], None]:
    def hook(p: torch.Tensor) -> None:
        if not found and p.grad is not None and not _finite(p.grad):
            how = f"the gradient of its parameter {name!r} became NaN or inf"
            found.append(_finding(name.rpartition(".")[0], "backward", p.grad, how))

    return hook


@torch.no_grad()
def _first_bad(
    named: Iterator[tuple[str, torch.Tensor]],
) -> tuple[str, torch.Tensor] | None:
    return next(((n, p) for n, p in named if p.is_floating_point() and not _finite(p)), None)


@contextmanager
def _alone(model: Any, wrapped: Any, module: torch.nn.Module) -> Iterator[None]:
    """The replay calls the module itself, not its wrapper: no DDP collective (every
    process may take its own path through the replay, or none), no compiled graph (the
    hooks see every module)."""
    if wrapped is module or getattr(model, "_module", None) is not wrapped:
        yield
        return
    model._module = module  # TorchModel's: its compute_output calls it
    try:
        yield
    finally:
        model._module = wrapped


class _restored:
    """Around the replay: the gradients, the buffers and the random generators as they
    were before it (the step is skipped: its own gradients are dropped after); inside
    it, the generators as they were at ``start``, when given."""

    def __init__(self, module: torch.nn.Module, start: Generators | None) -> None:
        self.module, self.start = module, start

    def __enter__(self) -> None:
        self.generators = Generators()
        if self.start is not None:
            self.start.put_back()
        self.params = list(self.module.parameters())
        self.grads = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        with torch.no_grad():
            self.buffers = [(b, b.clone()) for b in self.module.buffers()]

    def __exit__(self, *exc: object) -> None:
        for p, grad in zip(self.params, self.grads, strict=True):
            p.grad = grad
        with torch.no_grad():
            for b, saved in self.buffers:
                b.copy_(saved)
        self.generators.put_back()


def _users(engine: Any, phase: str) -> list[str]:
    """The hooks and overrides on ``phase`` that are not runmodel's own packs', named."""
    table = engine.table
    return [
        f"{phase} {'override' if h.override else 'hook'} {h.name!r}"
        for h in (*table.overrides.get(phase, ()), *table.hooks.get(phase, ()))
        if h.pack is None or not type(h.pack).__module__.startswith("runmodel.")
    ]


def _finding(module: str, phase: str, tensor: torch.Tensor, how: str) -> Finding:
    return Finding(
        module=module,
        phase=phase,
        shape=list(tensor.shape),
        dtype=str(tensor.dtype).removeprefix("torch."),
        how=how,
    )


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The floating-point tensors in ``value`` (nested in tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _finite(t: Any) -> bool:
    if not isinstance(t, torch.Tensor):
        return True
    t = t.detach()
    local = getattr(t, "to_local", None)  # a DTensor: this process's shard
    return bool(torch.isfinite(local() if callable(local) else t).all())
