"""One run of ``runmodel check-resume`` (``check_resume.py``), in a process of its own:
``python -m runmodel.runs.check_resume_child PLAN ROLE [options]``, or under torchrun.

The run is the source's own (``open_target(source).run_with(action)``: its model, its
engine with what its ``configure`` attaches, a config's packs), trained ``steps`` steps in
``run_dir`` (so relative pack folders go there, as in any run folder). What this module
adds to it, by hooks on the engine (none of them a pack: nothing of theirs goes into a
checkpoint):

* after every step, a digest of the module's state (``ROLE-digests-rankR.jsonl``, one line
  a step, written as it goes, so a killed run keeps what it did);
* ``--save-at S``: a ``Checkpoint`` pack (``run_dir/check-resume``) saving after every
  S-th step;
* ``--kill S``: during step S+1, once the checkpoint at S is on disk, the process sends
  itself SIGKILL (``ROLE-killed-rankR`` says it got there);
* ``--resume PATH``: the run continues from that checkpoint;
* ``--record D``: at step D, the batch's digest and each module's output digest in the
  order the forward passes end (``ROLE-outputs-rankR.json``); the run stops after it;
* at the end of a run that was not stopped, its state as ``engine.run`` leaves it: the
  model's state (weights, optimizer) and the random generators', every tensor whole
  (``ROLE-final-rankR.pt``, this process's shard under ``fsdp``);
* ``ROLE-result-rankR.json``: how the run ended, or the error that ended it.

Every run seeds Python's, NumPy's and torch's generators with 0 before it builds the model
(a config seeds them again with its own seed), so that runs of a model that seeds nothing
start alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar

import torch
from torch import nn

from .._io import read_json, write_json
from ..backends.distributed import env
from ..checkpoint.names import checkpoints_in
from ..config.registry import make_pack
from ..engine import Engine, RunArguments
from ..models.torchutil import unwrap
from ..packs import Checkpoint
from ..session.folder import RunFolder, start_record
from . import torchrun
from .target import ConfigTarget, TargetError, open_target

__all__ = ["CHECKPOINTS", "CheckRun", "digest", "files", "main", "plain_items", "tensor_bytes"]

#: The Checkpoint pack's folder inside the run folder.
CHECKPOINTS = "check-resume"
#: How long a process about to be killed waits for the checkpoint to be on disk.
CHECKPOINT_WAIT = 120.0


def files(directory: Path, role: str, rank: int) -> dict[str, Path]:
    """What a run of ``role`` writes for process ``rank`` in ``directory``."""
    return {
        kind: directory / f"{role}-{kind}-rank{rank}.{ext}"
        for kind, ext in (
            ("digests", "jsonl"),
            ("final", "pt"),
            ("outputs", "json"),
            ("result", "json"),
            ("killed", "txt"),
        )
    }


# -- digests ------------------------------------------------------------------------------


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes (this process's shard of a distributed tensor), on the CPU, as
    one flat ``uint8`` tensor: what "bit for bit" compares."""
    local = getattr(tensor, "to_local", None)
    if callable(local):  # a DTensor (fsdp): this process's shard
        tensor = local()
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def digest(items: Sequence[tuple[str, Any]]) -> str:
    """One digest of named values (tensors by dtype, shape and bytes, others by repr)."""
    h = hashlib.blake2b(digest_size=16)
    for name, value in items:
        h.update(name.encode())
        if isinstance(value, torch.Tensor):
            h.update(f"{value.dtype}{tuple(value.shape)}".encode())
            h.update(tensor_bytes(value).numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def plain_items(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """A nested state (dicts, lists, tuples) as ``(dotted path, leaf)`` pairs in its
    order; tensors are this process's own (a DTensor's shard), on the CPU."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from plain_items(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from plain_items(item, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(value, torch.Tensor):
        local = getattr(value, "to_local", None)
        yield prefix, (local() if callable(local) else value).detach().cpu().clone()
    else:
        yield prefix, value


def _tensors(value: Any) -> list[tuple[str, Any]]:
    """The tensors in a module's output (nested tuples, lists, dicts)."""
    return [(name, leaf) for name, leaf in plain_items(value) if isinstance(leaf, torch.Tensor)]


def _module(model: Any) -> nn.Module | None:
    """The model's network, unwrapped from DDP or ``torch.compile``; None if it has no
    ``torch.nn.Module``."""
    native = getattr(model, "model", None)
    found = unwrap(native()) if callable(native) else None
    return found if isinstance(found, nn.Module) else None


def _weights(model: Any) -> dict[str, Any]:
    """The module's state (parameters and buffers); for a model without a module, its
    ``state_dict()``."""
    module = _module(model)
    if module is not None:
        return module.state_dict()
    state = model.state_dict() if callable(getattr(model, "state_dict", None)) else {}
    return state.get("module", state) if isinstance(state, dict) else {}


def _parameter_names(model: Any) -> list[str]:
    """The optimizer's parameters by name, in the order its state dict numbers them."""
    module, optimizer = _module(model), getattr(model, "optimizer", None)
    if module is None or optimizer is None:
        return []
    names = {id(p): name for name, p in module.named_parameters()}
    return [
        names.get(id(p), f"#{i}")
        for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])
    ]


# -- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Role:
    """What this run does besides training (see the module's docstring)."""

    name: str
    run_dir: Path
    save_at: int | None = None
    kill: int | None = None
    resume: Path | None = None
    record: int | None = None


@dataclass
class CheckRun:
    """The action: the source's run of ``steps`` steps with the role's hooks."""

    role: Role
    out: Path  # where the records go
    steps: int
    backend: str | None
    #: for a config: its packs, made in the run folder as a config run's are
    config_packs: Sequence[Any] | None = None
    trains: ClassVar[bool] = True

    def __call__(self, engine: Engine, model: Any, arguments: RunArguments) -> Any:
        role, rank = self.role, env.rank()
        paths = files(self.out, role.name, rank)
        engine.attach(
            *(make_pack(spec, directory=Path(spec.type_)) for spec in self.config_packs or ())
        )
        _refuse_folders_outside(engine)
        checkpoint = None
        if role.save_at is not None:
            checkpoint = Checkpoint(CHECKPOINTS, every=f"{role.save_at}st", keep=None)
            engine.attach(checkpoint)
        with open(paths["digests"], "w") as log:
            self._hooks(engine, model, paths, log, checkpoint)
            result = engine.run(
                model,
                "train",
                steps=self.steps,
                epochs=arguments.epochs,
                setup_options=arguments.setup_options,
                backend=self._backend(arguments),
                resume=role.resume,
                run_dir=self._folder(engine),
            )
        return {"ended": result.ended, "steps": result.steps, "epochs": result.epochs}

    def _folder(self, engine: Engine) -> RunFolder:
        """The run's folder, claimed already (the check gives each run a folder of its
        own, or the killed run's to its resumed one), as a config run's is: so that under
        torchrun no process but rank 0 claims it."""
        record = {**start_record(engine.table.packs, "train"), "check_resume": self.role.name}
        return RunFolder(self.role.run_dir, record, claimed=True)

    def _backend(self, arguments: RunArguments) -> Any:
        """Under torchrun: a config's own ddp or fsdp (``with_backend`` put it there), else
        ``--backend`` or ddp, as ``runmodel run`` does; else the source's."""
        if not env.launched() or self.config_packs is not None:
            return arguments.backend
        return self.backend or "ddp"

    def _hooks(
        self,
        engine: Engine,
        model: Any,
        paths: dict[str, Path],
        log: IO[str],
        checkpoint: Checkpoint | None,
    ) -> None:
        role = self.role

        def record_digest(engine: Engine) -> None:
            s = engine.state
            log.write(
                json.dumps(
                    {
                        "step": s.step + 1,
                        "epoch": s.epoch,
                        "epoch_step": s.epoch_step + 1,
                        "digest": digest(list(_weights(model).items())),
                    }
                )
                + "\n"
            )
            log.flush()

        # last of all runstep hooks: the step's state as every other hook left it
        engine.on("runstep", record_digest, priority=-3000, name="check_resume.digest")
        if role.kill is not None:
            assert checkpoint is not None
            engine.on(
                "runstep",
                lambda e: _die(checkpoint.directory, paths["killed"]),
                once=role.kill,
                priority=-2000,
                name="check_resume.kill",
            )
        if role.record is not None:
            recorder = OutputRecorder(model, paths["outputs"])
            engine.on(
                "step_start",
                recorder.start,
                once=role.record - 1,
                priority=-3000,
                name="check_resume.record",
            )
            engine.on(
                "runstep",
                recorder.end,
                once=role.record - 1,
                priority=3000,
                name="check_resume.recorded",
            )
        else:
            engine.on(
                "teardown",
                lambda e: _write_final(e, model, paths["final"]),
                priority=10_000,
                name="check_resume.final",
            )


def _refuse_folders_outside(engine: Engine) -> None:
    """Each of the check's runs writes into a run folder of its own, where packs given
    relative folders write too; a pack given an absolute folder would have the runs
    write into one folder (and refuse, or move aside, what is there): refused."""
    for key, pack in engine.table.packs.items():
        folder = getattr(pack, "directory", None)
        if isinstance(folder, Path) and folder.is_absolute():
            raise TargetError(
                f"pack {key!r} ({type(pack).__name__}) writes to {folder}, a "
                f"folder of its own: the check runs the model several times, "
                f"each in a run folder of its own where relative folders go; "
                f"give the pack a relative folder (or a script option that "
                f"sets one)"
            )


def _die(folder: Path, marker: Path) -> None:
    """SIGKILL this process, once the checkpoint is on disk (under ddp rank 0 writes it;
    the others see it in the shared folder)."""
    deadline = time.monotonic() + CHECKPOINT_WAIT
    while not (folder.is_dir() and checkpoints_in(folder)):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"no checkpoint appeared in {folder} in {CHECKPOINT_WAIT:.0f}s "
                f"after the step it was due"
            )
        time.sleep(0.05)
    marker.write_text(f"{os.getpid()}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _engine_state(engine: Engine) -> dict[str, Any]:
    """The engine's own state that a resume must carry on exactly: not the run's record
    (its id and times), nor metrics a clock measures (throughput), nor packs' state."""
    own = engine.state_dict()
    loss = own["metrics"].get("loss")
    return {
        "counters": own["counters"],
        "loss": own["loss"],
        "epoch_sums": own["epoch_sums"],
        **({"metrics": {"loss": loss}} if loss is not None else {}),
    }


def _write_final(engine: Engine, model: Any, path: Path) -> None:
    """The state the run ended with: the model's (weights, optimizer), the engine's own
    (its counters, the last loss, the epoch's sums and mean loss: what a resume carries on)
    and the random generators', as ``(path, value)`` pairs; only for a run that ended
    without error."""
    from ..checkpoint.format import rng_state

    if engine.state.error is not None:
        return
    state = model.state_dict() if callable(getattr(model, "state_dict", None)) else {}
    torch.save(
        {
            "model": list(plain_items(state)),
            "engine": list(plain_items(_engine_state(engine))),
            "rng": list(plain_items(rng_state())),
            "parameters": _parameter_names(model),
            "step": engine.state.step,
        },
        path,
    )


class OutputRecorder:
    """At one step: the batch's digest, then each module's output digest as its forward
    pass ends (children before their parents); the run stops after the step."""

    def __init__(self, model: Any, path: Path) -> None:
        self.model, self.path = model, path
        self.batch: str | None = None
        self.calls: list[dict[str, Any]] = []
        self.handles: list[Any] = []

    def start(self, engine: Engine) -> None:
        self.batch = digest(_tensors(engine.state.batch) or [("batch", engine.state.batch)])
        module = _module(self.model)
        if module is None:
            return
        for name, sub in module.named_modules():
            self.handles.append(sub.register_forward_hook(self._hook(name)))

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            self.calls.append(
                {
                    "module": name,
                    "type": type(module).__name__,
                    "input": digest(_tensors(inputs)),
                    "output": digest(_tensors(output)),
                }
            )

        return hook

    def end(self, engine: Engine) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        write_json(
            self.path, {"step": engine.state.step + 1, "batch": self.batch, "calls": self.calls}
        )
        engine.stop("check-resume recorded its step")


# -- the process ----------------------------------------------------------------------------


def _seed() -> None:
    random.seed(0)
    torch.manual_seed(0)
    try:
        import numpy

        numpy.random.seed(0)
    except ImportError:
        pass


def _parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="python -m runmodel.runs.check_resume_child")
    made.add_argument("plan", type=Path)
    made.add_argument("role")
    made.add_argument("--run-dir", type=Path, required=True)
    made.add_argument("--save-at", type=int)
    made.add_argument("--kill", type=int)
    made.add_argument("--resume", type=Path)
    made.add_argument("--record", type=int)
    return made


def run(plan: dict[str, Any], role: Role, out: Path) -> dict[str, Any]:
    """The run of ``role`` as ``plan`` (what the parent was asked) describes it."""
    _seed()
    target = open_target(
        plan["source"],
        device=plan.get("device"),
        options=plan.get("options", ()),
        argv=plan.get("argv", ()),
    )
    action = CheckRun(role, out, plan["steps"], plan.get("backend"))
    if isinstance(target, ConfigTarget):
        if env.several():  # its own ddp or fsdp, else --backend (ddp): as `runmodel run`
            target.config = torchrun.with_backend(target.config, plan.get("backend"))
        action.config_packs = target.config.packs
    result: dict[str, Any] = target.run_with(action)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    plan = read_json(args.plan)
    out = args.plan.parent
    role = Role(args.role, args.run_dir, args.save_at, args.kill, args.resume, args.record)
    path = files(out, role.name, env.rank())["result"]
    try:
        result = run(plan, role, out)
    except TargetError as error:
        write_json(path, {"error": str(error), "usage": True})
        print(f"runmodel check-resume: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        write_json(path, {"error": f"{type(error).__name__}: {error}", "usage": False})
        traceback.print_exc()
        return 1
    write_json(path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
