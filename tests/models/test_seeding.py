"""``runmodel.seed(n)``: Python's, NumPy's and torch's generators seeded as a config run's
``seed`` seeds them (the same function), and the seed in a script run's record."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

import runmodel
from runmodel.config.runconfig import RunConfig
from runmodel.runs import prepare

from helpers import make_data, params


def draws() -> tuple[float, float, float]:
    return random.random(), float(numpy.random.rand()), torch.rand(()).item()


def test_seed_seeds_python_numpy_and_torch() -> None:
    assert runmodel.seed(11) == 11
    first = draws()
    runmodel.seed(11)
    assert draws() == first
    runmodel.seed(12)
    assert all(a != b for a, b in zip(draws(), first, strict=True))


class Unseeded(runmodel.TorchModel):
    """A classifier built from torch's generator as it is (helpers.Tiny seeds it itself)."""

    def __init__(
        self, device: str | None = None, init_options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(device, init_options)
        self.module = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
        )

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.train_data = make_data(2, 8, 4, classes=3)


def test_a_config_run_seeds_as_runmodel_seed(tmp_path: Path) -> None:
    """A config run with ``seed = 7`` builds its model from the generators as
    ``runmodel.seed(7)`` leaves them: the same initial weights."""
    name = f"unseeded_{uuid.uuid4().hex[:8]}"
    runmodel.register_model(name, Unseeded)
    prepared = prepare(RunConfig.from_dict({"model": name, "seed": 7}), tmp_path, progress=False)
    runmodel.seed(7)
    assert torch.equal(params(prepared.model), params(Unseeded()))
    runmodel.seed(8)
    assert not torch.equal(params(prepared.model), params(Unseeded()))


def test_a_script_run_records_its_seed(tmp_path: Path) -> None:
    runmodel.seed(3)
    model = Unseeded()  # its initial weights depend on the seed
    runmodel.Engine(progress=False).run(model, epochs=1, run_dir=tmp_path / "run")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["seed"] == 3


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True, "0"])
def test_a_bad_seed_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"runmodel.seed\(n\) takes a whole number"):
        runmodel.seed(bad)  # type: ignore[arg-type]
