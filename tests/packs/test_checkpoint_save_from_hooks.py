"""``checkpoint.save()`` from any hook (issue 36 item 9): a checkpoint of the run as it
stands, named for where a resumed run starts, from which the run goes on exactly as the
straight one (every loss, every evaluation, the weights); and the pack's own save ranks
the evaluation of its step, whatever the other hooks' order constraints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Checkpoint, Evaluate, Throughput

from helpers import params

EPOCHS = 3  # of 4 steps each: steps 4-7 are epoch 1

Record = tuple[Any, ...]


class Shuffled(runmodel.TorchModel):
    """Dropout, Adam and a shuffled DataLoader: a resume is exact only with the weights,
    the optimizer's state, the generators and the data's position all restored (the
    evaluation's loader draws a seed from torch's generator too)."""

    def __init__(self, device: Any = "cpu", init_options: Any = None) -> None:
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.25), nn.Linear(8, 1))

    def setup(self, setup_options: Any = None) -> None:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(40, 4, generator=g)
        y = x.sum(1, keepdim=True)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=0.05)
        self.loss_fn = nn.MSELoss()
        self.train_data = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=8, shuffle=True)
        self.eval_data = DataLoader(TensorDataset(x[32:], y[32:]), batch_size=4)


def recorded_run(
    folder: Path,
    save_on: tuple[str, Callable[[runmodel.Engine], bool]] | None = None,
    resume: Path | None = None,
) -> tuple[list[Record], Shuffled, list[Path | None]]:
    """A run of ``EPOCHS`` epochs recording every step's loss and every epoch's
    evaluation; ``save_on=(phase, when)``: a hook of that phase (after the others but the
    pack's own) calls ``checkpoint.save()`` where ``when(engine)``."""
    checkpoint = Checkpoint(folder, every="100ep")  # no save of its own in this run
    engine = runmodel.Engine(Evaluate(), checkpoint, progress=False)
    records: list[Record] = []
    engine.on(
        "runstep",
        lambda e: records.append(("loss", e.state.step, e.state.loss.item())),
        priority=100,
    )
    engine.on(
        "epoch_end",
        lambda e: records.append(("eval", e.state.epoch, e.state.metrics["eval_loss"])),
        priority=-100,  # after Evaluate's
    )
    saved: list[Path | None] = []
    if save_on is not None:
        phase, when = save_on
        engine.on(phase, lambda e: saved.append(checkpoint.save()), when=when, priority=-500)
    model = Shuffled()
    engine.run(model, epochs=EPOCHS, resume=resume)
    return records, model, saved


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Record], torch.Tensor]:
    records, model, _ = recorded_run(tmp_path_factory.mktemp("straight"))
    return records, params(model)


def _at(phase: str, **counters: int) -> tuple[str, Callable[[runmodel.Engine], bool]]:
    def when(engine: runmodel.Engine) -> bool:
        return all(getattr(engine.state, k) == v for k, v in counters.items())

    return phase, when


# (the hook, the checkpoint's name, the first record of the resumed run)
CASES = {
    "runstep, mid-epoch": (_at("runstep", step=5), "ckpt-00001-0000000006.pt", ("loss", 6)),
    "runstep, an epoch's last step": (
        _at("runstep", step=7),
        "ckpt-00001-0000000008.pt",
        ("eval", 1),  # that epoch's end comes first
    ),
    "step_start": (_at("step_start", step=6), "ckpt-00001-0000000006.pt", ("loss", 6)),
    "epoch_end": (_at("epoch_end", epoch=1), "ckpt-00002-0000000008.pt", ("loss", 8)),
    "epoch_start": (_at("epoch_start", epoch=1), "ckpt-00001-0000000004.pt", ("loss", 4)),
    "setup": (("setup", lambda e: True), "ckpt-00000-0000000000.pt", ("loss", 0)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_save_from_a_hook_resumes_exactly(
    tmp_path: Path, straight: tuple[list[Record], torch.Tensor], case: str
) -> None:
    save_on, name, first = CASES[case]
    reference, weights = straight
    records, model, saved = recorded_run(tmp_path / "ckpt", save_on)
    assert records == reference  # saving changed nothing of the run
    assert torch.equal(params(model), weights)
    assert [p.name if p else p for p in saved] == [name]
    path = saved[0]
    assert path is not None
    resumed, model, _ = recorded_run(tmp_path / "ckpt", resume=path)
    assert resumed[0][:2] == first
    assert resumed == reference[-len(resumed) :]  # every loss and evaluation from there
    assert torch.equal(params(model), weights)


def test_a_save_in_a_resumed_runs_setup_writes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _, _, [path] = recorded_run(folder, _at("epoch_end", epoch=0))
    assert path is not None
    _, _, again = recorded_run(folder, ("setup", lambda e: True), resume=path)
    assert again == [None]  # it stands where the checkpoint it resumed from does


def test_save_outside_a_run_is_a_clear_error(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "ckpt")
    with pytest.raises(RuntimeError, match="no run of this pack is under way"):
        checkpoint.save()
    runmodel.Engine(checkpoint, progress=False).run(Shuffled(), epochs=1)
    with pytest.raises(RuntimeError, match="from one of its hooks"):
        checkpoint.save()  # engine.run returned


def test_the_packs_save_ranks_the_evaluation_of_its_step(tmp_path: Path) -> None:
    """A user hook ordered before Evaluate and after Throughput's report once pulled the
    save ahead of the evaluation (Throughput's report runs last of all): the best was
    ranked by the evaluation of two steps before."""
    checkpoint = Checkpoint(tmp_path / "ckpt", every="2st", keep=1, best=("eval_loss", "min"))
    engine = runmodel.Engine(
        Throughput(every="2st"), Evaluate(every="2st"), checkpoint, progress=False
    )

    @engine.on("runstep", before="evaluate", after="throughput.report")
    def between(engine: runmodel.Engine) -> None:
        pass

    measured: dict[int, float] = {}
    engine.on(
        "runstep",
        lambda e: measured.setdefault(e.state.step + 1, e.state.metrics["eval_loss"]),
        after="evaluate",
        every="2st",
    )
    engine.run(Shuffled(), epochs=1)
    order = [h.name for h in engine.table.hooks["runstep"]]
    assert order.index("evaluate") < order.index("checkpoint.save")
    assert checkpoint.best_saved, "no best checkpoint"
    value, name = checkpoint.best_saved[0]
    step = int(name.removesuffix(".pt").rsplit("-", 1)[1])
    assert value == measured[step]
