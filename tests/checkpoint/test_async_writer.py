"""The background writer (``checkpoint.Writer``) keeps the tensors it staged from one save
to the next (its CPU copies, and the tensors over them): a save whose state has changed
its layout (the same storage seen through another view, another dtype, a flag that
flipped) or holds the rare kinds of tensor (conjugate and negative views, sparse) writes
what a synchronous save writes, every time. The sharded writer
(``sharded.saving.ShardedWriter``) stages its shards with the same ``Stager``: its folders
hold the synchronous save's bytes too. (The pack's async behaviour is in
tests/packs/test_checkpoint_async.py.)
"""

from __future__ import annotations

import filecmp
import pickle
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from runmodel import checkpoint

import warm as subprocess


def snapshot(model: dict[str, Any]) -> dict[str, Any]:
    return {"engine": {"counters": {"step": 1}, "packs": {}}, "model": model}


def assert_as_synchronous(
    tmp_path: Path, writer: checkpoint.Writer, name: str, model: dict[str, Any]
) -> dict[str, Any]:
    """Save ``model`` both ways; the files are the same bytes; the async one read back."""
    checkpoint.save(tmp_path / f"{name}-sync.pt", snapshot(model))
    writer.submit(tmp_path / f"{name}-async.pt", snapshot(model))
    writer.wait()
    return same_files_read_back(tmp_path, name)


def same_files_read_back(tmp_path: Path, name: str) -> dict[str, Any]:
    """``name``'s synchronous and async files are the same bytes; the async one's model."""
    assert filecmp.cmp(
        tmp_path / f"{name}-sync.pt", tmp_path / f"{name}-async.pt", shallow=False
    ), name
    state: dict[str, Any] = checkpoint.read(tmp_path / f"{name}-async.pt")["model"]
    return state


def test_a_state_that_changes_its_layout_between_saves_is_written_as_it_is_now(
    tmp_path: Path,
) -> None:
    weights = torch.arange(12.0)
    parameter = torch.nn.Parameter(torch.ones(2, 3))
    writer = checkpoint.Writer()
    first = assert_as_synchronous(
        tmp_path,
        writer,
        "first",
        {"weights": weights, "rows": weights.view(3, 4)[1:], "parameter": parameter},
    )
    assert torch.equal(first["rows"], torch.arange(4.0, 12.0).view(2, 4))
    assert first["parameter"].requires_grad
    # the same storages again, seen otherwise: a transposed view first (not the whole
    # storage in order), a flag that flipped, new values; then another dtype
    weights.add_(1)
    parameter.requires_grad_(False)
    second = assert_as_synchronous(
        tmp_path,
        writer,
        "second",
        {"columns": weights.view(4, 3).t(), "rows": weights.view(3, 4)[1:], "parameter": parameter},
    )
    assert torch.equal(second["columns"], (torch.arange(12.0) + 1).view(4, 3).t())
    assert (
        second["columns"].untyped_storage().data_ptr()
        == second["rows"].untyped_storage().data_ptr()
    )  # one storage, as in the state
    assert not second["parameter"].requires_grad
    third = assert_as_synchronous(tmp_path, writer, "third", {"bits": weights.view(torch.int32)})
    assert torch.equal(third["bits"], (torch.arange(12.0) + 1).view(torch.int32))
    # and back to the first layout: its staged tensors hold this save's values
    weights.mul_(2)
    fourth = assert_as_synchronous(
        tmp_path,
        writer,
        "fourth",
        {"weights": weights, "rows": weights.view(3, 4)[1:], "parameter": parameter},
    )
    assert torch.equal(fourth["weights"], (torch.arange(12.0) + 1) * 2)


def test_conjugate_negative_and_sparse_tensors_are_copied_with_their_values(tmp_path: Path) -> None:
    numbers = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    rare = {
        "numbers": numbers,
        "conjugate": numbers.conj(),
        "negative": numbers.conj().imag,  # a negative view of the same storage
        "sparse": torch.eye(3).to_sparse(),
    }
    writer = checkpoint.Writer()
    for name in ("first", "again"):  # the second save finds the first one's copies
        writer.submit(tmp_path / f"{name}.pt", snapshot(rare))
        writer.wait()
        state = checkpoint.read(tmp_path / f"{name}.pt")["model"]
        assert torch.equal(state["numbers"], numbers)
        assert torch.equal(state["conjugate"].resolve_conj(), numbers.conj().resolve_conj())
        assert torch.equal(state["negative"].resolve_neg(), -numbers.imag)
        assert torch.equal(state["sparse"].to_dense(), torch.eye(3))
        numbers.mul_(2)
        rare["negative"] = numbers.conj().imag


def test_the_writer_refuses_parameters_that_are_not_finite_and_only_those(
    tmp_path: Path,
) -> None:
    """The check reads the copy's parameters: huge finite ones (whose sum overflows) are
    written, a NaN among them refused before anything is written, and an inf buffer
    (not a parameter) is no reason to refuse."""
    module = torch.nn.Linear(2, 2)
    module.register_buffer("scale", torch.tensor(float("inf")))
    with torch.no_grad():
        module.weight.fill_(3e38)
    writer = checkpoint.Writer()
    state = {"module": module.state_dict()}
    writer.submit(tmp_path / "huge.pt", snapshot(state), module=module)
    writer.wait()
    assert torch.equal(
        checkpoint.read(tmp_path / "huge.pt")["model"]["module"]["weight"], module.weight.detach()
    )
    with torch.no_grad():
        module.bias[1] = float("nan")
    refused = "not saving the checkpoint nan.pt: parameters bias hold NaN or inf"
    with pytest.raises(FloatingPointError, match=refused):
        writer.submit(tmp_path / "nan.pt", snapshot({"module": module.state_dict()}), module=module)
    writer.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.pt"]


def test_the_model_state_taken_from_the_live_model_follows_every_change_between_saves(
    tmp_path: Path,
) -> None:
    """With ``model_parts`` the writer takes the model's state from the live module and
    optimizer, planned at the first save: each save below writes the synchronous save's
    bytes though the state changed in a way the plan has to see (a schedule's learning
    rate, an unfreeze, optimizer states added, a parameter or buffer replaced, a
    parameter's data swapped, a number among the optimizer's states, a state_dict hook,
    the optimizer's state loaded), and the plan is kept where nothing of its layout
    changed."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    )
    module[2].requires_grad_(False)  # frozen: no optimizer state for it yet
    optimizer = torch.optim.Adam(  # two groups sharing the default betas
        [{"params": module[0].parameters()}, {"params": [*module[1:].parameters()], "lr": 0.01}]
    )
    writer = checkpoint.Writer()
    engine = {"counters": {"step": 1, "epoch": 0}, "packs": {}}  # ("step": as Adam's key)

    def step() -> None:
        module(torch.randn(5, 3)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    def assert_as_synchronous(name: str) -> dict[str, Any]:
        sync = {"engine": engine, "model": checkpoint.format.torch_state(module, optimizer)}
        checkpoint.save(tmp_path / f"{name}-sync.pt", sync)
        writer.submit(
            tmp_path / f"{name}-async.pt",
            {"engine": engine, "model": None},
            module=module,
            model_parts=(module, optimizer),
        )
        writer.wait()
        return same_files_read_back(tmp_path, name)

    step()
    assert_as_synchronous("first")
    planned = writer._model
    assert planned is not None
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    step()
    assert_as_synchronous("again")  # each group holds its initial_lr now
    schedule.step()  # the rates halved
    scheduled = assert_as_synchronous("scheduled")
    assert [g["lr"] for g in scheduled["optimizer"]["param_groups"]] == [0.0005, 0.005]
    module[2].requires_grad_(True)  # unfrozen
    unfrozen = assert_as_synchronous("unfrozen")
    assert unfrozen["requires_grad"] == dict.fromkeys(unfrozen["requires_grad"], True)
    assert writer._model is planned  # none of these changed the layout
    step()  # its first states for the unfrozen layer
    assert len(assert_as_synchronous("new states")["optimizer"]["state"]) == 6
    module[0].bias = torch.nn.Parameter(torch.full((4,), 3.0))
    assert torch.equal(assert_as_synchronous("replaced")["module"]["0.bias"], torch.full((4,), 3.0))
    module[1].running_mean = torch.full((4,), 2.0)
    buffer = assert_as_synchronous("buffer")["module"]["1.running_mean"]
    assert torch.equal(buffer, torch.full((4,), 2.0))
    module[2].weight.data = torch.ones(2, 4)  # the same parameter over another storage
    assert torch.equal(assert_as_synchronous("data")["module"]["2.weight"], torch.ones(2, 4))
    for seen in (1, 2):  # a number among a parameter's states
        optimizer.state[module[0].weight]["seen"] = seen
        numbered = assert_as_synchronous(f"number {seen}")["optimizer"]["state"]
        assert numbered[0]["seen"] == seen
    hook = module[1].register_state_dict_post_hook(
        lambda owner, state, prefix, metadata: state.update({f"{prefix}scale": torch.ones(1)})
    )
    assert "1.scale" in assert_as_synchronous("hooked")["module"]
    hook.remove()
    optimizer.load_state_dict(optimizer.state_dict())  # its states are new tensors
    step()
    assert_as_synchronous("loaded")
    planned = writer._model
    step()
    assert_as_synchronous("loaded again")
    assert writer._model is planned


SHARDED_SAVES = textwrap.dedent("""
    import sys
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from runmodel.checkpoint.sharded.saving import Sharded, ShardedWriter, save

    out = Path(sys.argv[1])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    for unit in module:
        fully_shard(unit)
    fully_shard(module)


    class Model:
        def __init__(self):
            self.module = module
            self.optimizer = torch.optim.Adam(module.parameters())


    model = Model()
    sharded = Sharded(model, dist.new_group(backend="gloo"), 0, 1, "token")
    writer = ShardedWriter(sharded)
    snapshot = {"engine": {"counters": {"step": 1}}, "model": {}}
    for name in ("first", "second"):  # the second save finds the first one's buffers
        module(torch.randn(3, 4)).square().sum().backward()
        model.optimizer.step()
        model.optimizer.zero_grad()
        save(out / f"{name}-sync", snapshot, sharded)
        writer.submit(out / f"{name}-async", snapshot)
        with torch.no_grad():  # the training goes on while the copy is written
            for parameter in module.parameters():
                parameter.add_(1)
        writer.wait()
        with torch.no_grad():
            for parameter in module.parameters():
                parameter.sub_(1)
    dist.destroy_process_group()
""")


def test_an_async_sharded_save_writes_the_synchronous_saves_bytes(tmp_path: Path) -> None:
    """fsdp's sharded parameters (DTensors) in one gloo process, and Adam's state: the
    async folder's shards and run state are the synchronous save's bytes, its metadata
    the same but for the save's own path and id, though the parameters changed before
    the write ended."""
    (tmp_path / "saves.py").write_text(SHARDED_SAVES)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "saves.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for name in ("first", "second"):
        sync, background = tmp_path / f"{name}-sync", tmp_path / f"{name}-async"
        files = sorted(p.name for p in sync.iterdir())
        assert files == sorted(p.name for p in background.iterdir())
        assert files == [".metadata", "__0_0.distcp", "run-0.pt"]
        for file in files[1:]:
            assert filecmp.cmp(sync / file, background / file, shallow=False), (name, file)
        ours, theirs = (
            pickle.loads((folder / ".metadata").read_bytes()) for folder in (sync, background)
        )
        layers = [f"{layer}.{kind}" for layer in range(3) for kind in ("weight", "bias")]
        assert {f"module.{name}" for name in layers} | {
            f"optimizer.state.{name}.{moment}"
            for name in layers
            for moment in ("exp_avg", "exp_avg_sq")
        } <= set(ours.state_dict_metadata)
        for part in ("state_dict_metadata", "storage_data", "planner_data"):
            assert getattr(ours, part) == getattr(theirs, part), (name, part)


@pytest.mark.skipif(sys.platform != "linux", reason="the writer process is forked on Linux")
def test_each_writer_process_ends_with_its_writer_and_a_sigterm_does_not_end_it(
    tmp_path: Path,
) -> None:
    """A writer's process ends once its ``Writer`` is gone, though another writer's process
    was forked after it (it must not hold the first one's input open), and it lives
    through the SIGTERM a scheduler sends every process of a job (the training process
    acts on it, and waits for the write)."""
    import gc
    import os
    import signal
    import time

    first, second = checkpoint.Writer(), checkpoint.Writer()
    model = {"w": torch.arange(6.0)}
    for name, writer in (("first", first), ("second", second)):
        writer.submit(tmp_path / f"{name}.pt", snapshot(model))
        writer.wait()
    process = first._process
    assert process is not None and process.pid != second._process.pid  # type: ignore[union-attr]
    os.kill(process.pid, signal.SIGTERM)
    assert_as_synchronous(tmp_path, first, "after-sigterm", {"w": torch.ones(3)})
    assert process.alive
    del first
    gc.collect()
    deadline = time.monotonic() + 30  # it ends within milliseconds
    while process.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process.alive and process._exit_code() == 0
    assert_as_synchronous(tmp_path, second, "second-again", model)


def test_a_writer_first_used_from_a_thread_that_ended_still_writes(tmp_path: Path) -> None:
    """Linux ends a process at the end of the *thread* that forked it (when it asked for
    that, PR_SET_PDEATHSIG, as the writer's process does to die with the training's): a
    run trained in a thread that has ended (a notebook's, a server's) must not leave its
    Checkpoint pack's writer dead for the next run's saves."""
    import threading

    writer = checkpoint.Writer()
    model = {"w": torch.arange(6.0)}
    thread = threading.Thread(target=assert_as_synchronous, args=(tmp_path, writer, "t", model))
    thread.start()
    thread.join()
    assert_as_synchronous(tmp_path, writer, "main", {"w": torch.ones(3)})
    assert writer._process is not None and writer._process.alive
