"""Resuming in another number of processes (torchrun, gloo, CPU): a sharded checkpoint
of 2 processes in 1 and of 1 in 2 (DCP reshards), a ``ddp`` checkpoint file under
``fsdp``, a sharded one in a plain process, with exactly the saved weights and
optimizer state before the first step; the line that says what differs; a checkpoint
after an epoch's last step resumed as one at the epoch's end; a mid-epoch checkpoint and
another optimizer class refused at setup.

The child script is test_fsdp.py's model (``net.py``) with hooks that write the full
weights and optimizer state at the first epoch's start (what the run resumed with) and at
each epoch's end (what its checkpoint holds). The launches run one after another, in a
thread started once for the module.
"""

from __future__ import annotations

import copy
import os
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fsdp import MODEL, assert_equal_weights, finish, launch, net_module

import runmodel
from runmodel.packs import Checkpoint

CHILD = textwrap.dedent('''
    """net.py's Net, checkpointed every epoch, its full state written as it starts and
    at each epoch's end: python reshard.py BACKEND EPOCHS OUT [RESUME]"""
    import os
    import sys

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


    backend, epochs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    resume = sys.argv[4] if len(sys.argv) > 4 else None
    engine = runmodel.Engine()
    engine.attach(Checkpoint(f"{out}/ckpt", every="1ep", keep=None))
    if os.environ.get("MID_EPOCH"):
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

    model = AdamNet() if os.environ.get("ADAM") else Net()
    engine.run(model, epochs=epochs, backend=backend, resume=resume)
''')

#: name -> (processes, backend, epochs, resume from (a launch's folder, a path in it), env);
#: two chains, each in a thread: the fsdp launches, and the ddp ones
LAUNCHES: dict[str, tuple[int, str, int, tuple[str, str] | None, dict[str, str]]] = {
    "two": (2, "fsdp", 2, None, {"MID_EPOCH": "1"}),  # 8 steps an epoch
    "two_to_one": (1, "fsdp", 3, ("two", "ckpt/ckpt-00002-0000000016"), {}),  # 16 steps
    "one_to_two": (2, "fsdp", 4, ("two_to_one", "ckpt/ckpt-00003-0000000032"), {}),
    "ddp": (2, "ddp", 1, None, {}),
    "ddp_to_fsdp": (1, "fsdp", 2, ("ddp", "ckpt/ckpt-00001-0000000008.pt"), {}),
    "adam": (1, "fsdp", 3, ("two", "ckpt/ckpt-00002-0000000016"), {"ADAM": "1"}),
    # saved after epoch 2's last step, before its end: resumed as two_to_one is
    "last_to_one": (1, "fsdp", 3, ("two", "last/ckpt-00002-0000000016"), {}),
}


class Launches:
    """The launches: those of a chain one after another (each after the one it resumes),
    the two chains side by side."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "net.py").write_text(MODEL)
        (root / "reshard.py").write_text(CHILD)
        self.results: dict[str, tuple[int, str, str]] = {}
        self.done = {name: threading.Event() for name in LAUNCHES}
        chains = [[n for n in LAUNCHES if "ddp" not in n], [n for n in LAUNCHES if "ddp" in n]]
        self._threads = [
            threading.Thread(target=self._run_all, args=(chain,), daemon=True) for chain in chains
        ]
        for thread in self._threads:
            thread.start()

    def folder(self, name: str) -> Path:
        return self.root / name

    def _run_all(self, chain: list[str]) -> None:
        for name in chain:
            processes, backend, epochs, resume, env = LAUNCHES[name]
            try:
                out = self.folder(name)
                out.mkdir()
                args = [backend, str(epochs), str(out)]
                if resume is not None:
                    args.append(str(self.folder(resume[0]) / resume[1]))
                path = os.pathsep.join(filter(None, [str(self.root), os.environ.get("PYTHONPATH")]))
                self.results[name] = finish(
                    launch(
                        [
                            sys.executable,
                            "-m",
                            "torch.distributed.run",
                            "--standalone",
                            "--nproc-per-node",
                            str(processes),
                            str(self.root / "reshard.py"),
                            *args,
                        ],
                        out,
                        PYTHONPATH=path,
                        **env,
                    )
                )
            finally:
                self.done[name].set()

    def ok(self, name: str) -> str:
        """The launch's stderr, once it ended well."""
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
    for thread in made._threads:
        thread.join(timeout=600)


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
