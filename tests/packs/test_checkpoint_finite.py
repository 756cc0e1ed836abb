"""The Checkpoint pack's check of the weights before a save finds NaN, inf and -inf in
every floating kind of parameter (half, bfloat16, single, complex), and names it; with
``async_save=True`` the background writer finds them in its copy (the parameters laid
out back to back per dtype), refuses in the same words, writes nothing and keeps the good
checkpoints, and takes a buffer holding inf (AMP's scaler) for what it is. (The
synchronous refusal's outcome is in tests/faults/test_bad_input.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import runmodel
from runmodel import checkpoint
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
@pytest.mark.parametrize("async_save", [False, True])
def test_a_parameter_that_is_not_finite_is_found_in_every_floating_kind(
    tmp_path: Path, dtype: torch.dtype, bad: complex, async_save: bool
) -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 1))
    module.register_parameter("extra", nn.Parameter(torch.ones(64, 3, dtype=dtype).t()))
    data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(2)]
    model = runmodel.TorchModel.from_parts(
        module, optimizer=torch.optim.SGD, loss_fn=nn.MSELoss(), train_data=data
    )
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1st", async_save=async_save))

    @engine.on("runstep", once=1)  # before the second save
    def diverge(engine: runmodel.Engine) -> None:
        with torch.no_grad():
            module.extra[1, 50] = bad

    with pytest.raises(FloatingPointError, match=r"step 2: parameters extra hold NaN or inf"):
        engine.run(model, epochs=1)


def test_an_async_save_of_non_finite_parameters_writes_nothing_and_keeps_the_good_ones(
    tmp_path: Path,
) -> None:
    """Half and single parameters (two regions of the copy), one of them a view of part
    of its storage, and a buffer that holds inf on purpose: the saves before the
    divergence are written; the one after it is refused, naming both parameters."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 1))
    module.register_parameter("halves", nn.Parameter(torch.ones(6, dtype=torch.float16)))
    rows = torch.ones(4, 3)
    module.register_parameter("row", nn.Parameter(rows[1]))  # part of a storage
    module.register_buffer("scale", torch.tensor(float("inf")))  # not a parameter
    data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
    model = runmodel.TorchModel.from_parts(
        module, optimizer=torch.optim.SGD, loss_fn=nn.MSELoss(), train_data=data
    )
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path, every="1st", keep=None, async_save=True))

    @engine.on("runstep", once=2)  # before the third save
    def diverge(engine: runmodel.Engine) -> None:
        with torch.no_grad():
            module.halves[4] = float("inf")
            module.row[2] = float("nan")

    with pytest.raises(FloatingPointError) as caught:
        engine.run(model, epochs=1)
    assert str(caught.value).startswith(
        "not saving the checkpoint of epoch 0, step 3: parameters halves, row hold NaN or inf "
        "(the training diverged), and the checkpoints before it are kept"
    )
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-00000-0000000001.pt", "ckpt-00000-0000000002.pt"]
    state = checkpoint.read(tmp_path / names[-1])["model"]["module"]
    assert bool(state["halves"].isfinite().all()) and bool(state["row"].isfinite().all())
    assert state["scale"].isinf()


def test_the_check_sums_first_and_an_overflowing_sum_of_finite_values_is_still_finite() -> None:
    """``checkpoint.writer.all_finite`` sums single and double tensors (one pass, faster
    than their minimum and maximum): a finite sum settles it; a sum that overflows
    (finite values near the dtype's maximum) is settled by the minimum and maximum, not
    taken for a divergence; a NaN or an inf among large values is still found."""
    from runmodel.checkpoint.writer import all_finite

    big = torch.full((1000,), torch.finfo(torch.float32).max / 2)
    assert not bool(big.sum().isfinite())  # the sum overflows
    halves = torch.ones(8, dtype=torch.float16)
    assert all_finite([big, big.double() ** 2 / 1e300, halves])
    for bad in (float("nan"), float("inf"), -float("inf")):
        spoiled = big.clone()
        spoiled[500] = bad
        assert not all_finite([halves, spoiled])
        assert not all_finite([spoiled.double()])
    half_bad = halves.clone()
    half_bad[3] = float("inf")
    assert not all_finite([big[:10], half_bad])  # the summed ones fine, the half one not
