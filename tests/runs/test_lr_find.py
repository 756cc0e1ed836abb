"""The learning-rate finder (``runmodel.lr_find``, ``runmodel lr-find``): the range test
leaves the model's weights, its optimizer's state and learning rates and the random
generators as they were, stops when the loss diverges, suggests by fastai's valley rule
and draws its PNG."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.cli import main
from runmodel.runs.lr_find import suggest, valley

MODEL = """\
import torch
from torch import nn

import runmodel


class Small(runmodel.TorchModel):
    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))

    def setup(self, setup_options=None):
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.loss_fn = nn.CrossEntropyLoss()
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        self.train_data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]
"""


def trained_model() -> runmodel.TorchModel:
    """A classifier with dropout, Adam (its state not empty: it trained an epoch) and a
    shuffled DataLoader with its own generator."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    x = torch.randn(96, 4, generator=torch.Generator().manual_seed(1))
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    data = DataLoader(
        TensorDataset(x, y), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    model = runmodel.TorchModel.from_parts(
        module,
        optimizer=torch.optim.Adam,
        loss_fn=nn.CrossEntropyLoss(),
        train_data=data,
        device="cpu",
    )
    runmodel.Engine(progress=False).run(model, epochs=1)
    return model


def test_lr_find_leaves_the_model_as_it_was_and_writes_its_png(tmp_path: Path) -> None:
    model = trained_model()
    assert model.optimizer is not None and isinstance(model.train_data, DataLoader)
    weights = copy.deepcopy(model.module.state_dict())
    optimizer, state = model.optimizer, copy.deepcopy(model.optimizer.state_dict())
    generators = (torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy())
    loader = model.train_data.generator.get_state()
    during: list[torch.Tensor] = []
    engine = runmodel.Engine(progress=False)
    engine.on("teardown", lambda e: during.append(e.model.module[0].weight.detach().clone()))

    result = runmodel.lr_find(model, engine=engine, steps=40, plot=tmp_path / "lr")

    assert not torch.equal(during[0], weights["0.weight"])  # the test trained the module
    after = model.module.state_dict()
    assert list(after) == list(weights)
    assert all(torch.equal(after[k], weights[k]) for k in weights)  # bit for bit
    assert model.optimizer is optimizer
    _same(model.optimizer.state_dict(), state)
    assert [g["lr"] for g in model.optimizer.param_groups] == [1e-3]
    assert torch.equal(torch.get_rng_state(), generators[0])
    assert random.getstate() == generators[1]
    assert (numpy.random.get_state()[1] == generators[2]).all()
    assert torch.equal(model.train_data.generator.get_state(), loader)

    assert result.plot == tmp_path / "lr.png"
    assert result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.plot.stat().st_size > 10_000
    assert len(result.lrs) == len(result.losses) == len(result.raw_losses) <= 40
    assert result.lrs[0] == 1e-7
    assert all(b > a for a, b in zip(result.lrs, result.lrs[1:], strict=False))
    assert result.index is not None and result.suggestion == result.lrs[result.index]


def _same(a: object, b: object) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    else:
        assert a == b


def test_the_test_stops_once_the_loss_diverges() -> None:
    model = trained_model()
    result = runmodel.lr_find(model, steps=100, start_lr=1e-3, end_lr=1e4)
    assert result.ended.startswith("stopped at step ") and "diverged" in result.ended
    assert len(result.lrs) < 100
    last = result.losses[-1]
    assert not last <= 4 * min(result.losses[:-1])  # above 4x the lowest, or not finite


def test_valley_is_fastais_rule() -> None:
    """Indices fastai's valley() gives for these curves (its function run on them
    outside this repository): the longest falling run, the first of equal ones, counted
    from the step before it; fastai's -1 (the last rate) for a short valley at the start."""
    lrs = [float(i) for i in range(12)]
    assert valley(lrs, [5, 4, 6, 3, 2, 7, 1, 0.5, 8, 9, 9, 9]) == 4
    assert valley(lrs[:7], [1, 0, 1, 2, 2, 2, 8]) == 6
    assert valley(lrs[:2], [3, 3]) == 0
    assert valley(lrs[:10], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]) == 3
    # fastai's lr_find: the first tenth of the steps asked for and the last 5 left out
    losses = [2.3] * 10 + [2.2, 2.0, 1.7, 1.3, 1.0, 0.9, 0.95] + [3, 9, 20, 50, 90]
    assert suggest([float(i) for i in range(22)], losses, steps=100) == 12
    assert suggest([1.0] * 6, [1.0] * 6, steps=100) is None


def test_the_command_prints_a_suggestion_and_writes_its_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "small.py"
    source.write_text(MODEL)
    png = tmp_path / "curve.png"
    assert main(["lr-find", str(source), "--steps", "30", "-o", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("lr-find: 30 of 30 steps, learning rate 1e-07 to ")
    assert "  suggestion (valley): " in out and f"  plot: {png}" in out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bad_ranges_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "small.py"
    source.write_text(MODEL)
    assert main(["lr-find", str(source), "--start-lr", "1", "--end-lr", "0.1"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "runmodel lr-find: error: lr_find: end_lr (0.1) must be above start_lr "
        "(1): the test raises the learning rate"
    )
    with pytest.raises(ValueError, match="steps must be a whole number >= 2"):
        runmodel.lr_find(trained_model(), steps=1)
