"""SpikeGuard and NaNGuard in two processes (torchrun, gloo on the CPU), under ddp and
fsdp: a spike or a NaN in rank 1's batch only skips the same step on both ranks (one
all-reduce of the verdict), the weights stay equal across the ranks, and every process
exits 0; under ddp, ``locate=True`` names rank 1's batch on rank 1, and makes no
collective (rank 0 replays its own batch alone); ``SpikeGuard("rollback")`` goes back to
the same checkpoint on both ranks (then skips the spike that comes back in the replay).
One launch runs the six trainings in turn."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import warm as subprocess

ROOT = Path(__file__).resolve().parents[2]
BAD = 5  # the step whose batch is bad on rank 1
LIMIT_S = 240

SCRIPT = textwrap.dedent(
    """
    import json
    import os
    import sys

    import torch
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    import runmodel
    from runmodel.packs import Checkpoint, NaNGuard, SpikeGuard

    BAD, out = int(sys.argv[1]), sys.argv[2]
    rank = int(os.environ["RANK"])


    def train(backend, guard, poison, checkpoints=None):
        torch.manual_seed(0)
        batches = [(torch.randn(8, 3), torch.randn(8, 1)) for _ in range(16)]
        module = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        model = runmodel.TorchModel.from_parts(
            module, optimizer=lambda params: torch.optim.Adam(params, lr=1e-2),
            loss_fn=nn.MSELoss(), train_data=batches)
        saves = [Checkpoint(checkpoints, every="2st")] if checkpoints else []
        engine = runmodel.Engine(guard, *saves, progress=False)

        @engine.on("step_start", rank=1, once=BAD)
        def bad_batch(engine):
            x, y = engine.state.batch
            engine.state.batch = poison(x, y)

        result = engine.run(model, "train", steps=8, backend=backend)
        weights = get_model_state_dict(
            engine.model.module, options=StateDictOptions(full_state_dict=True))
        return {
            "skipped": getattr(guard, "spikes", None) or getattr(guard, "skipped", 0),
            "steps": result.steps,
            "found": (engine.state.divergence or {}).get("step"),
            "phase": (engine.state.divergence or {}).get("phase"),
            "actions": [r["action"] for r in getattr(guard, "records", [])],
            "weights": {k: v.tolist() for k, v in weights.items()},
        }


    found = {}
    for backend in ("ddp", "fsdp"):
        found[f"{backend}-spike"] = train(
            backend, SpikeGuard(window=3), lambda x, y: (x, y + 8.5))
        found[f"{backend}-nan"] = train(
            backend, NaNGuard(locate=True), lambda x, y: (torch.full_like(x, float("nan")), y))
    # the bad batch comes at step BAD in the replay too (a hook makes it): one rollback,
    # then a skip, on both processes
    for backend in ("ddp", "fsdp"):
        found[f"{backend}-rollback"] = train(
            backend, SpikeGuard("rollback", window=3), lambda x, y: (x, y + 8.5),
            f"{out}/{backend}-ckpt")
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(found, f)
    """
)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("guards")
    (tmp / "train.py").write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("TORCHELASTIC_RUN_ID", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(tmp / "train.py"),
            str(BAD),
            str(tmp),
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize(
    "run",
    ["ddp-spike", "ddp-nan", "ddp-rollback", "fsdp-spike", "fsdp-nan", "fsdp-rollback"],
)
def test_a_bad_batch_on_rank_1_skips_the_same_step_on_both(
    ranks: list[dict[str, Any]], run: str
) -> None:
    first, second = (r[run] for r in ranks)
    if run.endswith("rollback"):
        assert first["actions"] == second["actions"] == ["rollback", "skip"]
        assert first["weights"] == second["weights"] and first["steps"] == second["steps"] == 8
        return
    assert first["skipped"] == second["skipped"] == 1
    assert first["steps"] == second["steps"] == 8
    assert first["weights"] == second["weights"]
    if run.endswith("spike"):
        assert first["found"] == second["found"] == BAD
    elif run == "ddp-nan":  # located where the NaN is: rank 1's batch (rank 0's is finite)
        assert (first["phase"], second["phase"]) == (None, "batch")
        assert second["found"] == BAD
