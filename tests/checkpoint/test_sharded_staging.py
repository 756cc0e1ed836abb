"""The async sharded save's staging plan (``sharded.saving.StagingPlan``), in one gloo
process under fsdp: DCP's ``get_state_dict`` is called at the first save only and no
``state_dict()`` is built after it, and DCP's ``save`` runs in the writer process, not in
the training process; a state that changed between saves (the optimizer's
state tensors replaced, a hyperparameter changed) is written as it is now; a writer process
that died mid-write is one error naming the save, and the next save starts a new one;
parameters that hold NaN are refused before anything is written; under a storage that writes the
model's state itself, ``engine.snapshot()`` builds no model state. (The bytes against a
synchronous save's: tests/checkpoint/test_async_writer.py.)"""

from __future__ import annotations

import json
import sys
import textwrap
from typing import Any

import pytest
import torch

import runmodel

import warm as subprocess

SAVES = textwrap.dedent("""
    import json
    import os
    import signal
    import sys
    from pathlib import Path

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from runmodel.checkpoint.sharded import read_whole
    from runmodel.checkpoint.sharded.saving import Sharded, ShardedWriter

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
            self.optimizer = torch.optim.Adam(module.parameters(), lr=0.1)


    model = Model()
    sharded = Sharded(model, dist.new_group(backend="gloo"), 0, 1, "token")
    calls = {"get_state_dict": 0, "state_dict": 0}
    state, module_state_dict = Sharded.state, nn.Module.state_dict
    optimizer_state_dict = torch.optim.Optimizer.state_dict


    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call


    calls["dcp.save"] = 0
    dcp.save = counted("dcp.save", dcp.save)  # in this process: none (the writer process's)
    Sharded.state = counted("get_state_dict", state)
    nn.Module.state_dict = counted("state_dict", module_state_dict)
    torch.optim.Optimizer.state_dict = counted("state_dict", optimizer_state_dict)


    def step():
        module(torch.randn(3, 4)).square().sum().backward()
        model.optimizer.step()
        model.optimizer.zero_grad()


    def full(tensor):
        return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


    writer = ShardedWriter(sharded)
    snapshot = {"engine": {"counters": {"step": 1}}, "model": None}
    report = {}
    for name in ("first", "second", "third", "replaced", "lr"):
        step()
        if name == "replaced":  # new state tensors: planned again
            for per in model.optimizer.state.values():
                per["exp_avg"] = per["exp_avg"].clone()
        if name == "lr":
            model.optimizer.param_groups[0]["lr"] = 0.25
        before = dict(calls)
        plan = writer._plan
        writer.submit(out / name, snapshot)
        report[name] = {
            "get_state_dict": calls["get_state_dict"] - before["get_state_dict"],
            "state_dict": calls["state_dict"] - before["state_dict"],
            "same_plan": writer._plan is plan,
        }
        expected = {k: full(v).clone() for k, v in module_state_dict(module).items()}
        moments = [full(s["exp_avg"]).clone() for s in model.optimizer.state.values()]
        with torch.no_grad():  # the training goes on while the copy is written
            for parameter in module.parameters():
                parameter.add_(1)
        writer.wait()
        with torch.no_grad():
            for parameter in module.parameters():
                parameter.sub_(1)
        whole = read_whole(out / name)
        report[name]["weights_as_at_submit"] = all(
            torch.equal(whole["module"][k], v) for k, v in expected.items()
        )
        saved_moments = [s["exp_avg"] for s in whole["optimizer"]["state"].values()]
        report[name]["moments_as_at_submit"] = len(saved_moments) == len(moments) and all(
            torch.equal(a, b) for a, b in zip(saved_moments, moments)
        )
        report[name]["lr"] = whole["optimizer"]["param_groups"][0]["lr"]
    # the writer process dies in the middle of a write (stopped before it reads the save,
    # then killed): the error names the save, and the next save starts a new writer process
    dead = writer._process
    os.kill(dead.pid, signal.SIGSTOP)
    writer.submit(out / "died", snapshot)
    os.kill(dead.pid, signal.SIGKILL)
    try:
        writer.wait()
    except RuntimeError as error:
        report["died"] = str(error)
    step()
    writer.submit(out / "after", snapshot)
    writer.wait()
    report["after"] = {
        "new_process": writer._process is not dead and writer._process.alive,
        "died_visible": (out / "died").exists(),
        "weights": all(
            torch.equal(read_whole(out / "after")["module"][k], full(v))
            for k, v in module_state_dict(module).items()
        ),
    }
    with torch.no_grad():
        module[2].weight.to_local()[0, 0] = float("nan")
    try:
        writer.submit(out / "nan", snapshot)
    except FloatingPointError as error:
        report["refused"] = str(error)
    report["dcp_saves_here"] = calls["dcp.save"]
    report["nan_written"] = (out / ".nan.tmp-token").exists() or (out / "nan").exists()
    print("REPORT " + json.dumps(report))
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("staging")
    (folder / "saves.py").write_text(SAVES)
    done = subprocess.run(
        [sys.executable, str(folder / "saves.py"), str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("REPORT "))
    result: dict[str, Any] = json.loads(line[len("REPORT ") :])
    return result


def test_dcp_writes_in_the_writer_process_only(report: dict[str, Any]) -> None:
    assert report["dcp_saves_here"] == 0  # 7 saves written, none by this process


def test_dcp_state_is_resolved_at_the_first_save_only(report: dict[str, Any]) -> None:
    assert report["first"]["get_state_dict"] == 1
    for name in ("second", "third", "lr"):
        assert report[name] == {**report[name], "get_state_dict": 0, "state_dict": 0}, name
        assert report[name]["same_plan"], name


def test_each_save_holds_the_state_at_its_submit(report: dict[str, Any]) -> None:
    for name in ("first", "second", "third", "replaced", "lr"):
        assert report[name]["weights_as_at_submit"], name
        assert report[name]["moments_as_at_submit"], name


def test_a_changed_state_is_planned_again_and_hyperparameters_are_current(
    report: dict[str, Any],
) -> None:
    assert not report["replaced"]["same_plan"]  # the optimizer's state tensors are new
    assert report["replaced"]["get_state_dict"] == 1
    assert report["third"]["lr"] == 0.1
    assert report["lr"]["lr"] == 0.25


def test_nonfinite_parameters_are_refused_before_anything_is_written(
    report: dict[str, Any],
) -> None:
    assert report["refused"].startswith("not saving the checkpoint nan: parameters 2.weight hold")
    assert not report["nan_written"]


def test_a_writer_process_that_died_is_one_error_and_the_next_save_starts_anew(
    report: dict[str, Any],
) -> None:
    assert report["died"].startswith("writing sharded checkpoint ")
    assert (
        "/died' in the background failed: RuntimeError: the sharded checkpoint's "
        in (report["died"])
    )
    assert "writer process ended (exit code -9) before the write was done" in report["died"]
    assert report["after"] == {"new_process": True, "died_visible": False, "weights": True}


class _Writes:
    writes_model_state = True


def test_a_storage_that_writes_the_model_state_gets_no_model_part() -> None:
    engine = runmodel.core.BareEngine(storage=_Writes())  # type: ignore[arg-type]
    engine.model = runmodel.TorchModel.from_parts(torch.nn.Linear(2, 2))
    assert engine.snapshot()["model"] is None
    plain = runmodel.core.BareEngine()
    plain.model = engine.model
    assert set(plain.snapshot()["model"]["module"]) == {"weight", "bias"}
