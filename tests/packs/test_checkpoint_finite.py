"""The Checkpoint pack's check of the weights before a save finds NaN, inf and -inf in
every floating kind of parameter (half, bfloat16, single, complex), and names it. (The
refusal's outcome, the good checkpoints kept, is in tests/faults/test_bad_input.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import runmodel
from runmodel.packs import Checkpoint


@pytest.mark.parametrize(
    ("dtype", "bad"),
    [
        (torch.float16, float("inf")),
        (torch.bfloat16, -float("inf")),
        (torch.float32, float("nan")),
        (torch.complex64, complex(0.0, float("nan"))),
        (torch.float64, -float("inf")),
    ],
)
def test_a_parameter_that_is_not_finite_is_found_in_every_floating_kind(
    tmp_path: Path, dtype: torch.dtype, bad: complex
) -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 1))
    module.register_parameter("extra", nn.Parameter(torch.ones(64, 3, dtype=dtype).t()))
    data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(2)]
    model = runmodel.TorchModel.from_parts(
        module, optimizer=torch.optim.SGD, loss_fn=nn.MSELoss(), train_data=data
    )
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1st"))

    @engine.on("runstep", once=1)  # before the second save
    def diverge(engine: runmodel.Engine) -> None:
        with torch.no_grad():
            module.extra[1, 50] = bad

    with pytest.raises(FloatingPointError, match=r"step 2: parameters extra hold NaN or inf"):
        engine.run(model, epochs=1)
