"""The options of the ``ddp`` and ``fsdp`` backends, declared and checked in one place
(``backends/distributed/options.py``), and the pack's state kept by its ``Dealer``."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from runmodel.backends.distributed.data import Dealer
from runmodel.backends.distributed.ddp import DistributedRun
from runmodel.backends.distributed.options import DDPOptions, FSDPOptions


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ({"timeout": True}, ValueError, "Mine(timeout=True): give seconds > 0"),
        ({"timeout": 0}, ValueError, "Mine(timeout=0): give seconds > 0"),
        ({"end_timeout": "60"}, ValueError, "Mine(end_timeout='60'): give the seconds"),
        ({"preempt_check_every": 2.0}, ValueError, "Mine(preempt_check_every=2.0): give"),
        ({"seed": 1.5}, ValueError, "Mine(seed=1.5): give a whole number, or None"),
        ({"shard_data": 1}, TypeError, "Mine(shard_data=) takes True or False, got 1"),
        ({"ddp_options": []}, TypeError, "Mine(ddp_options=) takes a dict"),
        ({"process_group": "tcp"}, ValueError, "Mine(process_group='tcp'): give 'gloo'"),
    ],
)
def test_a_bad_ddp_option_is_refused_naming_its_owner(
    given: dict, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match="^" + re.escape(message)):
        DDPOptions(owner="Mine", **given)


def test_ddp_options_are_held_as_the_backend_uses_them() -> None:
    options = DDPOptions(end_timeout=5, seed=-3, ddp_options=None)
    assert options.end_timeout == 5.0 and isinstance(options.end_timeout, float)
    assert (options.seed, options.ddp_options) == (-3, {})  # any int seeds
    given = {"broadcast_buffers": False}
    assert DDPOptions(ddp_options=given).ddp_options is not given  # a copy


def test_fsdp_options_are_held_as_the_backend_uses_them() -> None:
    options = FSDPOptions(units="Linear", param_dtype="torch.bfloat16", checkpoint_timeout=9)
    assert options.units == ["Linear"] and options.param_dtype is torch.bfloat16
    assert options.checkpoint_timeout == 9.0 and options.reduce_dtype is None
    with pytest.raises(TypeError, match=r"^FSDP\(units=\[\]\)"):
        FSDPOptions(units=[])
    with pytest.raises(ValueError, match=r"^FSDP\(checkpoint_timeout=True\)"):
        FSDPOptions(checkpoint_timeout=True)


def test_the_packs_checkpoint_state_is_its_dealers_with_the_keys_it_always_had() -> None:
    model = SimpleNamespace(module=torch.nn.Linear(1, 1), train_data=[1, 2, 3])
    run = DistributedRun(model, model.module)
    try:
        assert isinstance(run.dealer, Dealer) and run.dealer.backend == "ddp"
        state = run.state_dict()
        assert state == {
            "world": 1,
            "epoch": -1,
            "skipped_before": 0,
            "chain": [],
            "epoch_batches": 3,
            "dealt": None,
        }
        run.load_state_dict({**state, "epoch": 4})
        assert run.dealer.loaded == {**state, "epoch": 4}
    finally:
        run.restore()
