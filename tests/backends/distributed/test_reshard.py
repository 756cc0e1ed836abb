"""Resuming in another number of processes (torchrun, gloo, CPU): a sharded checkpoint
of 2 processes in 1 and of 1 in 2 (DCP reshards), a ``ddp`` checkpoint file under
``fsdp``, a sharded one in a plain process, with exactly the saved weights and
optimizer state before the first step; the line that says what differs; a checkpoint
after an epoch's last step resumed as one at the epoch's end; a mid-epoch checkpoint and
another optimizer class refused at setup.

The child script is test_fsdp.py's model (``net.py``) with hooks that write the full
weights and optimizer state at the first epoch's start (what the run resumed with) and at
each epoch's end (what its checkpoint holds). Starting processes costs seconds, so each
launch runs several trainings one after another: the 2-process fsdp and ddp runs, then
every resume of theirs in 1 process, then the 1-process checkpoint resumed in 2; the
launches run one after another, in a thread started once for the module.
"""

from __future__ import annotations

import copy
import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fsdp import MODEL, assert_equal_weights, net_module

import runmodel
from runmodel.packs import Checkpoint

from launching import finish, launch, sections, torchrun_args

CHILD = textwrap.dedent('''
    """net.py's Net, checkpointed every epoch, its full state written as it starts and
    at each epoch's end; the trainings of a JSON list, one after another, in this process:
    python reshard.py RUNS.json. Each prints "=== run NAME ===" to stderr as it begins,
    and writes its exit code (1: it raised) to its folder's "code"."""
    import json
    import os
    import sys
    import traceback

    import torch

    import runmodel
    from net import Net
    from runmodel.packs import Checkpoint


    class AdamNet(Net):
        def setup(self, setup_options=None):
            super().setup(setup_options)
            self.optimizer = torch.optim.Adam(self.module.parameters(), lr=0.01)


    def full_state(engine, path):
        """Collective under fsdp; rank 0 writes the weights and the optimizer's state,
        keyed by parameter name."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        weights, optimizer = get_state_dict(engine.model.module, engine.model.optimizer,
                                            options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
        if engine.state.rank == 0:
            torch.save({"module": weights, "optimizer": optimizer}, path)


    def train(name, backend, epochs, out, resume=None, mid_epoch=False, adam=False):
        engine = runmodel.Engine()
        engine.attach(Checkpoint(f"{out}/ckpt", every="1ep", keep=None))
        if mid_epoch:
            engine.attach(Checkpoint(f"{out}/mid", every="5st", keep=1))
            engine.attach(Checkpoint(f"{out}/last", every="4st", keep=1))  # at each epoch's end
        first = [True]

        @engine.on("epoch_start")
        def restored(engine):
            if first:
                first.clear()
                full_state(engine, f"{out}/restored.pt")

        @engine.on("epoch_end", priority=-5000)
        def at_end(engine):
            full_state(engine, f"{out}/epoch{engine.state.epoch + 1}.pt")

        model = AdamNet() if adam else Net()
        engine.run(model, epochs=epochs, backend=backend, resume=resume)


    with open(sys.argv[1]) as file:
        runs = json.load(file)
    for run in runs:
        print(f"=== run {run['name']} ===", file=sys.stderr, flush=True)
        code = 0
        try:
            train(**run)
        except Exception:  # a refusal: said as an uncaught error would, then the next run
            traceback.print_exc()
            code = 1
        if os.environ["RANK"] == "0":
            with open(f"{run['out']}/code", "w") as file:
                file.write(str(code))
''')

#: name -> (backend, epochs, resume from (a training's folder, a path in it), options);
#: the launches, in turn: their processes, and the trainings they run one after another
TRAININGS: dict[str, tuple[str, int, tuple[str, str] | None, dict[str, bool]]] = {
    "two": ("fsdp", 2, None, {"mid_epoch": True}),  # 8 steps an epoch
    "ddp": ("ddp", 1, None, {}),
    "two_to_one": ("fsdp", 3, ("two", "ckpt/ckpt-00002-0000000016"), {}),  # 16 steps
    "adam": ("fsdp", 3, ("two", "ckpt/ckpt-00002-0000000016"), {"adam": True}),
    # saved after epoch 2's last step, before its end: resumed as two_to_one is
    "last_to_one": ("fsdp", 3, ("two", "last/ckpt-00002-0000000016"), {}),
    "ddp_to_fsdp": ("fsdp", 2, ("ddp", "ckpt/ckpt-00001-0000000008.pt"), {}),
    "one_to_two": ("fsdp", 4, ("two_to_one", "ckpt/ckpt-00003-0000000032"), {}),
}
LAUNCHES: list[tuple[int, list[str]]] = [
    (2, ["two", "ddp"]),
    (1, ["two_to_one", "last_to_one", "ddp_to_fsdp", "adam"]),  # refused: last
    (2, ["one_to_two"]),
]


class Launches:
    """The launches, one after another (each resumes what the one before saved), in a
    thread; each training's exit code (of its own, not its launch's: the launch goes on to
    its next training) and its part of the launch's stderr."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "net.py").write_text(MODEL)
        (root / "reshard.py").write_text(CHILD)
        self.results: dict[str, tuple[int, str, str]] = {}
        self.done = {name: threading.Event() for name in TRAININGS}
        self._thread = threading.Thread(target=self._run_all, daemon=True)
        self._thread.start()

    def folder(self, name: str) -> Path:
        return self.root / name

    def _run_all(self) -> None:
        try:
            for number, (processes, names) in enumerate(LAUNCHES):
                runs = []
                for name in names:
                    backend, epochs, resume, options = TRAININGS[name]
                    self.folder(name).mkdir()
                    runs.append(
                        {
                            "name": name,
                            "backend": backend,
                            "epochs": epochs,
                            "out": str(self.folder(name)),
                            "resume": resume and str(self.folder(resume[0]) / resume[1]),
                            **options,
                        }
                    )
                listed = self.root / f"launch-{number}.json"
                listed.write_text(json.dumps(runs))
                script = torchrun_args(self.root / "reshard.py", listed, processes=processes)
                code, out, err = finish(launch(script, self.root, path=[self.root]))
                parts = sections(err)
                for name in names:
                    ran = self.folder(name) / "code"
                    # a training that never wrote its code: the launch's own, and all it said
                    self.results[name] = (
                        int(ran.read_text()) if ran.exists() else code or -1,
                        out,
                        parts.get(name, err),
                    )
                    self.done[name].set()
        finally:
            for event in self.done.values():
                event.set()

    def ok(self, name: str) -> str:
        """The training's part of its launch's stderr, once it ended well."""
        code, _, err = self.result(name)
        assert code == 0, err[-4000:]
        return err

    def result(self, name: str) -> tuple[int, str, str]:
        self.done[name].wait(timeout=600)
        assert name in self.results, f"the {name} launch did not end"
        return self.results[name]

    def state(self, name: str, what: str) -> dict[str, Any]:
        loaded: dict[str, Any] = torch.load(self.folder(name) / f"{what}.pt", weights_only=True)
        return loaded


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launches]:
    made = Launches(tmp_path_factory.mktemp("reshard"))
    yield made
    made._thread.join(timeout=600)


def assert_same_state(resumed: dict[str, Any], saved: dict[str, Any]) -> None:
    """The weights, and the optimizer's per-parameter state and groups, bit for bit."""
    assert_equal_weights(resumed["module"], saved["module"])
    a, b = resumed["optimizer"], saved["optimizer"]
    assert a["state"].keys() == b["state"].keys() == resumed["module"].keys()
    for name, state in b["state"].items():
        assert state.keys() == a["state"][name].keys()
        for key, value in state.items():
            assert torch.equal(a["state"][name][key], value), (name, key)
    assert a["param_groups"] == b["param_groups"]


def test_a_2_process_fsdp_checkpoint_resumes_in_1_process_exactly(launches: Launches) -> None:
    launches.ok("two")
    err = launches.ok("two_to_one")
    assert_same_state(launches.state("two_to_one", "restored"), launches.state("two", "epoch2"))
    lines = [line for line in err.splitlines() if "written by 2" in line]
    assert len(lines) == 1 and lines[0].startswith(
        "runmodel: resuming in 1 process(es) a checkpoint written by 2: "
    ), err[-3000:]
    assert "from epoch 3 on" in lines[0] and "rank mod 2" in lines[0]
    # and it trains on: its epoch differs from the 2-process run's, as said
    assert not torch.equal(
        launches.state("two_to_one", "epoch3")["module"]["0.weight"],
        launches.state("two", "epoch2")["module"]["0.weight"],
    )


def test_a_checkpoint_after_an_epochs_last_step_resumes_in_another_world_as_its_end(
    launches: Launches,
) -> None:
    """Saved by every="4st" after the 8th (last) step of epoch 2, which is the epoch's
    end (the save waits for its epoch_end hooks): in 1 process it resumes as the
    checkpoint at the epoch's end does (the data are dealt out anew from epoch 3 on), and
    trains epoch 3 to the same weights, bit for bit."""
    launches.ok("two")
    assert [p.name for p in (launches.folder("two") / "last").iterdir()] == [
        "ckpt-00002-0000000016"
    ]  # taken at the end of epoch index 1 (its 8 steps done): named as the next epoch's
    err = launches.ok("last_to_one")
    lines = [line for line in err.splitlines() if "written by 2" in line]
    assert len(lines) == 1 and "from epoch 3 on" in lines[0], err[-3000:]
    assert_same_state(launches.state("last_to_one", "restored"), launches.state("two", "epoch2"))
    launches.ok("two_to_one")
    assert_same_state(
        launches.state("last_to_one", "epoch3"), launches.state("two_to_one", "epoch3")
    )


def test_a_1_process_fsdp_checkpoint_resumes_in_2_processes_exactly(launches: Launches) -> None:
    launches.ok("two_to_one")
    err = launches.ok("one_to_two")
    assert_same_state(
        launches.state("one_to_two", "restored"), launches.state("two_to_one", "epoch3")
    )
    assert err.count("runmodel: resuming in 2 process(es) a checkpoint written by 1: ") == 1


def test_a_ddp_checkpoint_resumes_under_fsdp_in_another_world_exactly(launches: Launches) -> None:
    launches.ok("ddp")
    err = launches.ok("ddp_to_fsdp")
    assert_same_state(launches.state("ddp_to_fsdp", "restored"), launches.state("ddp", "epoch1"))
    assert "a checkpoint written by 2: " in err and "saved rank 0's generators" in err
    assert "pack 'ddp'" not in err  # its sampler's seed went to the fsdp backend's pack


def test_another_optimizer_class_is_refused_under_fsdp(launches: Launches) -> None:
    code, _, err = launches.result("adam")
    assert code != 0
    assert "the checkpoint's optimizer is torch.optim.sgd.SGD" in err, err[-3000:]
    assert "torch.optim.adam.Adam" in err
    assert not (launches.folder("adam") / "restored.pt").exists()  # refused before a step


def test_a_sharded_checkpoint_resumes_in_a_plain_process(
    launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    """No process group: the whole state is read in this process, the optimizer's
    numbered again by parameter order; the run goes on from there."""
    launches.ok("two")
    net = net_module(launches.root)
    model, seen = net.Net("cpu"), {}
    engine = runmodel.Engine()

    @engine.on("epoch_start")
    def restored(engine: runmodel.Engine) -> None:
        if seen:
            return
        seen["module"] = {k: v.clone() for k, v in model.module.state_dict().items()}
        names = [n for n, _ in model.module.named_parameters()]
        optimizer = copy.deepcopy(model.optimizer.state_dict())  # steps change it in place
        seen["optimizer"] = {
            "state": {names[i]: s for i, s in optimizer["state"].items()},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"]]} for g in optimizer["param_groups"]
            ],
        }

    engine.run(model, epochs=3, resume=launches.folder("two") / "ckpt")
    assert_same_state(seen, launches.state("two", "epoch2"))
    assert "in 1 process(es) a checkpoint written by 2" in capsys.readouterr().err


def test_a_mid_epoch_checkpoint_is_refused_in_another_world(
    launches: Launches, tmp_path: Path
) -> None:
    launches.ok("two")
    mid = launches.folder("two") / "mid"
    assert [p.name for p in mid.iterdir()] == ["ckpt-00001-0000000015"]
    model = net_module(launches.root).Net("cpu")
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "ckpt"))
    with pytest.raises(
        ValueError,
        match=r"in the middle of epoch 2 \(after 7 steps\), and "
        r"this run has 1",
    ):
        engine.run(model, epochs=3, resume=mid)
    assert not any((tmp_path / "ckpt").glob("ckpt-*"))


def test_a_2_process_ddp_checkpoint_in_one_process_says_so(
    launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once silent: the file records the world size it was written in."""
    launches.ok("ddp")
    model = net_module(launches.root).Net("cpu")
    runmodel.Engine().run(model, epochs=2, resume=launches.folder("ddp") / "ckpt")
    err = capsys.readouterr().err
    assert err.count("runmodel: resuming in 1 process(es) a checkpoint written by 2: ") == 1
    assert "each takes saved rank 0's generators" in err
