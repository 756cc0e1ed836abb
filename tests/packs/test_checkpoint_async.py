"""``Checkpoint(async_save=True)``: the state is copied at the save and written by a
background thread. Its files are the synchronous ones byte for byte, a run resumes from
them exactly, keep= and best= prune only once the new file is on disk, a write that fails
in the background is raised at the next save or at the end of the run, naming the file,
and a process killed with SIGKILL in the middle of a background write leaves a folder
that resumes exactly.

The model (``helpers.dropout_mlp``) trains a small MLP with dropout and Adam on 4 fixed
batches an epoch; the killed process trains ``resume_run.Net`` (a shuffled DataLoader).
"""

from __future__ import annotations

import collections
import filecmp
import multiprocessing
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim.lr_scheduler import StepLR

import runmodel
from runmodel import checkpoint
from runmodel.packs import Checkpoint, LRSchedule, Unfreeze

import resume_run
from helpers import assert_equal_params, dropout_mlp, files, train_with_checkpoints


def test_async_files_are_the_synchronous_ones_byte_for_byte(tmp_path: Path) -> None:
    # every step, and the best 2 by a metric: the state at each save, and the pruning
    def scored(engine: runmodel.Engine) -> runmodel.Engine:
        engine.on(
            "runstep", lambda e: e.state.metrics.update(score=(e.state.step * 7) % 5), priority=-500
        )  # before the save
        # one run record for both runs: each checkpoint records its run's id and start
        engine.on("setup", lambda e: e.run_record.update(id="same", started=0.0))
        return engine

    for folder, async_save in (("sync", False), ("async", True)):
        train_with_checkpoints(
            tmp_path / folder,
            epochs=3,
            every="1st",
            keep=3,
            best=("score", "max"),
            keep_best=2,
            async_save=async_save,
            engine=scored(runmodel.Engine()),
        )
    names = files(tmp_path / "sync")
    assert len(names) == 5 and files(tmp_path / "async") == names  # 3 newest, 2 best
    for name in names:
        assert filecmp.cmp(tmp_path / "sync" / name, tmp_path / "async" / name, shallow=False), name


def test_async_files_follow_an_unfreeze_and_a_schedule_byte_for_byte(tmp_path: Path) -> None:
    """The writer takes the model's state from the live module and optimizer, planned at
    the first save; an unfreeze (requires_grad flipped, the optimizer's groups split,
    new states for the layer it unfreezes) and a schedule (a new rate each step) change
    it between saves, and every async file is still the synchronous one."""
    for folder, async_save in (("sync", False), ("async", True)):
        engine = runmodel.Engine()
        engine.attach(Unfreeze({0: ["2"], 1: "all"}, lr_scale={1: 0.5}))
        engine.attach(LRSchedule(lambda optimizer: StepLR(optimizer, step_size=1, gamma=0.9)))
        engine.on("setup", lambda e: e.run_record.update(id="same", started=0.0))
        train_with_checkpoints(
            tmp_path / folder,
            epochs=2,
            every="1st",
            keep=None,
            async_save=async_save,
            engine=engine,
        )
    names = files(tmp_path / "sync")
    assert len(names) == 8 and files(tmp_path / "async") == names
    for name in names:
        assert filecmp.cmp(tmp_path / "sync" / name, tmp_path / "async" / name, shallow=False), name
    last = checkpoint.read(tmp_path / "async" / names[-1])["model"]
    assert all(last["requires_grad"].values()) and len(last["optimizer"]["state"]) == 4


def test_the_copy_is_the_state_at_the_save_whatever_the_training_does_next(tmp_path: Path) -> None:
    weights = torch.arange(12.0)
    tied = weights.view(3, 4)[1:]  # a view into the same storage, at an offset
    module = collections.OrderedDict(weight=weights, tied=tied)
    module._metadata = {"": {"version": 2}}  # type: ignore[attr-defined]  # as state_dict()
    snapshot = {
        "engine": {"counters": {"step": 3}, "packs": {}},
        "model": {
            "module": module,
            "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]},
        },
    }
    checkpoint.save(tmp_path / "sync.pt", snapshot)
    writer = checkpoint.Writer()
    on_disk: list[bool] = []

    def then() -> None:
        on_disk.append((tmp_path / "async.pt").exists())

    writer.submit(tmp_path / "async.pt", snapshot, then)
    weights.add_(100)  # the training goes on: the file keeps the values at the save
    writer.wait()
    assert not writer.busy and on_disk == [True]
    assert filecmp.cmp(tmp_path / "sync.pt", tmp_path / "async.pt", shallow=False)
    saved = checkpoint.read(tmp_path / "async.pt")["model"]["module"]
    assert torch.equal(saved["weight"], torch.arange(12.0))
    assert (
        saved["tied"].untyped_storage().data_ptr() == saved["weight"].untyped_storage().data_ptr()
    )  # still one storage
    assert saved._metadata == {"": {"version": 2}}
    # the next save reuses the buffers, and still copies the values of its own moment
    writer.submit(tmp_path / "again.pt", snapshot)
    weights.zero_()
    writer.wait()
    again = checkpoint.read(tmp_path / "again.pt")["model"]["module"]
    assert torch.equal(again["weight"], torch.arange(12.0) + 100)


@pytest.mark.parametrize("every", ["1ep", "3st"])
def test_a_run_resumed_from_async_checkpoints_ends_as_a_straight_run(
    tmp_path: Path, every: str
) -> None:
    straight = dropout_mlp()
    runmodel.Engine().run(straight, epochs=4)
    train_with_checkpoints(tmp_path, epochs=2, every=every, keep=2, async_save=True)
    first = checkpoint.checkpoints_in(tmp_path)[0].name
    assert first == (
        "ckpt-00002-0000000008.pt" if every == "1ep" else "ckpt-00001-0000000006.pt"
    )  # 3st: mid-epoch 1
    resumed = dropout_mlp()
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every=every, keep=2, async_save=True))
    engine.run(resumed, epochs=4, resume=tmp_path)
    assert_equal_params(resumed, straight)


def test_keep_prunes_as_the_synchronous_pack_does_and_the_end_waits(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    pack = Checkpoint(tmp_path, every="1ep", keep=2, async_save=True)
    engine.attach(pack)
    seen: list[list[str]] = []
    costs: list[tuple[Any, ...]] = []  # (stall, floor, the writer's plan) after each save
    engine.on(
        "epoch_end",
        lambda e: (
            pack.wait(),
            seen.append(files(tmp_path)),
            costs.append(
                (
                    e.state.metrics.get("checkpoint_stall_s"),
                    e.state.metrics.get("checkpoint_floor_s"),
                    pack._writer._plan,  # type: ignore[union-attr]
                )
            ),
        ),
        priority=-2000,
    )  # after the save
    engine.run(dropout_mlp(), epochs=4)
    # every save records its stall and floor; the staging plan of the first save serves
    # them all (the random generators' states are new tensors at each save)
    assert all(stall > 0 and floor > 0 for stall, floor, _ in costs), costs
    assert all(plan is costs[0][2] for *_, plan in costs), [id(plan) for *_, plan in costs]
    for name in files(tmp_path):  # what a save costs is not in a checkpoint
        assert not {"checkpoint_stall_s", "checkpoint_floor_s"} & set(
            checkpoint.read(tmp_path / name)["engine"]["metrics"]
        )
    assert seen == [
        ["ckpt-00001-0000000004.pt"],
        ["ckpt-00001-0000000004.pt", "ckpt-00002-0000000008.pt"],
        ["ckpt-00002-0000000008.pt", "ckpt-00003-0000000012.pt"],
        ["ckpt-00003-0000000012.pt", "ckpt-00004-0000000016.pt"],
    ]
    # the run waited for its last write: on disk, nothing under way, no temporary files
    assert files(tmp_path) == seen[-1] and not pack._writer.busy  # type: ignore[union-attr]
    state = checkpoint.read(tmp_path / "ckpt-00004-0000000016.pt")
    assert state["engine"]["packs"]["checkpoint"]["saved"] == seen[-1]


def test_a_run_that_raises_waits_for_the_write_under_way(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    pack = Checkpoint(tmp_path, every="1st", keep=None, async_save=True)
    engine.attach(pack)

    def fail(e: runmodel.Engine) -> None:
        raise ValueError("the data ran dry")

    engine.on("step_start", fail, once=5)
    with pytest.raises(ValueError, match="the data ran dry"):
        engine.run(dropout_mlp(), epochs=3)
    assert not pack._writer.busy  # type: ignore[union-attr]
    assert files(tmp_path) == [f"ckpt-{s // 4:05d}-{s:010d}.pt" for s in range(1, 6)]
    assert checkpoint.read(tmp_path / "ckpt-00001-0000000005.pt")["engine"]["counters"]["step"] == 5


def test_a_failed_background_write_is_raised_at_the_next_save_naming_the_file(
    tmp_path: Path,
) -> None:
    # a folder where the checkpoint's file should go: the rename fails, for real
    blocked = tmp_path / "ckpt-00002-0000000008.pt"
    blocked.mkdir(parents=True)
    engine = runmodel.Engine()
    pack = Checkpoint(tmp_path, every="1ep", keep=1, async_save=True)
    engine.attach(pack)
    with pytest.raises(
        RuntimeError,
        match=r"writing checkpoint '.*ckpt-00002-0000000008\.pt' "
        r"in the background failed: IsADirectoryError",
    ) as error:
        engine.run(dropout_mlp(), epochs=4)
    assert isinstance(error.value.__cause__, IsADirectoryError)
    assert "epoch 2, step 12" in str(error.value.__notes__)  # raised at the next save (epoch 3)
    # keep=1 pruned nothing: the checkpoint before the failed one is still there, and it is
    # the newest again
    assert files(tmp_path) == ["ckpt-00001-0000000004.pt", "ckpt-00002-0000000008.pt"]
    assert pack.saved == ["ckpt-00001-0000000004.pt"]


def test_a_failed_last_write_is_raised_by_the_run(tmp_path: Path) -> None:
    (tmp_path / "ckpt-00002-0000000008.pt").mkdir(parents=True)
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1ep", keep=2, async_save=True))
    with pytest.raises(
        RuntimeError,
        match=r"writing checkpoint '.*ckpt-00002-0000000008\.pt' "
        r"in the background failed",
    ):
        engine.run(dropout_mlp(), epochs=2)
    assert [p.name for p in checkpoint.checkpoints_in(tmp_path) if p.is_file()] == [
        "ckpt-00001-0000000004.pt"
    ]


def test_bad_async_save_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"async_save= takes True or False, got 'yes'"):
        Checkpoint(tmp_path, async_save="yes")  # type: ignore[arg-type]


# -- SIGKILL in the middle of a background write -----------------------------------------

# processes forked from a forkserver that imported torch once (as tests/faults/test_exact_resume.py)
CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "runmodel", "resume_run"])


def train(folder: str, kill: int) -> None:
    """``resume_run.Net`` with a checkpoint written in the background after every step;
    resumed from ``folder`` if it holds one. ``kill``: the training's process dies with
    SIGKILL once the ``kill``-th checkpoint is written and fsynced, before its rename, by
    the writer process (``resume_run.kill_mid_async_save``)."""
    torch.set_num_threads(1)
    if kill:
        resume_run.kill_mid_async_save(kill)
    engine = runmodel.Engine()
    engine.attach(Checkpoint(folder, every="1st", keep=2, async_save=True))
    model = resume_run.Net(0)
    engine.run(
        model,
        epochs=resume_run.EPOCHS,
        resume=folder if checkpoint.checkpoints_in(folder) else None,
    )
    torch.save([p.detach() for p in model.module.parameters()], Path(folder) / "final.pt")


def test_killed_during_a_background_write_resumes_exactly(tmp_path: Path) -> None:
    kills = (6, 19)  # mid-epoch 0, mid-epoch 2 (8 steps an epoch)

    def run(kill: int, die: bool) -> Any:
        proc = CONTEXT.Process(target=train, args=(str(tmp_path / f"k{kill}"), kill * die))
        proc.start()
        return proc

    killed = {kill: run(kill, die=True) for kill in kills}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the processes
    try:
        straight = resume_run.Net(0)
        runmodel.Engine().run(straight, epochs=resume_run.EPOCHS)
    finally:
        torch.set_num_threads(threads)
    for kill, proc in killed.items():
        proc.join(timeout=240)
        assert proc.exitcode == -signal.SIGKILL, kill
        folder = tmp_path / f"k{kill}"
        # the write under way was cut short; the two before it are whole
        assert [p.name[:-8] for p in folder.glob(".ckpt-*.tmp*")] == [
            f".{checkpoint_name(kill)}.tmp"
        ]
        assert files(folder)[-2:] == [checkpoint_name(kill - 2), checkpoint_name(kill - 1)]
    resumed = {kill: run(kill, die=False) for kill in kills}
    for kill, proc in resumed.items():
        proc.join(timeout=240)
        assert proc.exitcode == 0, kill
        assert not list((tmp_path / f"k{kill}").glob(".*.tmp*")), "the killed write's file"
        final = torch.load(tmp_path / f"k{kill}" / "final.pt", weights_only=True)
        assert all(
            torch.equal(p, q) for p, q in zip(final, straight.module.parameters(), strict=True)
        ), f"killed at write {kill}"


def checkpoint_name(writes: int) -> str:
    """The name of the ``writes``-th checkpoint of ``resume_run.Net`` saved every step."""
    return f"ckpt-{(writes - 1) // resume_run.BATCHES:05d}-{writes:010d}.pt"
