"""Under ddp every process reads the epoch's loss the run records, after a resume too
(issue 37's leftover of R1): rank 0 writes the records and its checkpoints, so a process
resumed in the middle of an epoch goes on from rank 0's running sums; each process's
``state.metrics["loss"]`` at an epoch's end is rank 0's mean (``DistributedRun``'s
``share_epoch_means``), the same in a straight run and in a stopped and resumed one.
One torchrun launch (2 processes, gloo) runs all three."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TIMEOUT = 300
ROOT = Path(__file__).resolve().parents[3]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}
ENV.pop("TORCHELASTIC_RUN_ID", None)

#: 3 epochs of 4 steps a process (64 samples, batches of 8, 2 processes): a straight run;
#: one stopped after step 6 (the middle of epoch 2), saved; that one resumed. Each process
#: writes the loss it read at each epoch's end, per run, to OUT/rank<r>.json.
SCRIPT = textwrap.dedent("""
    import json
    import os
    import sys

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.packs import Checkpoint

    OUT = sys.argv[1]


    def model():
        torch.manual_seed(0)
        x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
        y = (x[:, 0] > 0).long()
        return runmodel.TorchModel.from_parts(
            nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)),
            optimizer=torch.optim.SGD, loss_fn=nn.CrossEntropyLoss(),
            train_data=DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True,
                                  generator=torch.Generator().manual_seed(1)))


    read = {}
    for name in ("straight", "stopped", "resumed"):
        engine = runmodel.Engine(progress=False)
        seen = read[name] = []
        engine.on("epoch_end", lambda e, seen=seen: seen.append(e.state.metrics.get("loss")),
                  reads="loss")
        if name != "straight":
            engine.attach(Checkpoint(OUT + "/checkpoint", every="1ep"))
        if name == "stopped":
            engine.on("runstep", lambda e: e.stop(), when=lambda e: e.state.step == 6)
        engine.run(model(), epochs=3, backend="ddp",
                   resume=OUT + "/checkpoint" if name == "resumed" else None)
    with open(f"{OUT}/rank{os.environ['RANK']}.json", "w") as file:
        json.dump(read, file)
""")


@pytest.fixture(scope="module")
def read(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, list[float]]]:
    folder = tmp_path_factory.mktemp("epoch-means")
    (folder / "train.py").write_text(SCRIPT)
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", "train.py", str(folder)],
        cwd=folder,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_every_process_reads_the_recorded_epoch_loss_after_a_mid_epoch_resume(
    read: list[dict[str, list[float]]],
) -> None:
    for rank, runs in enumerate(read):
        assert len(runs["straight"]) == 3 and None not in runs["straight"], (rank, runs)
        assert runs["stopped"][0] == runs["straight"][0], (rank, runs)
        assert runs["resumed"] == runs["straight"][1:], (rank, runs)  # epochs 2 and 3


def test_the_epoch_loss_is_rank_0s_on_every_process(
    read: list[dict[str, list[float]]],
) -> None:
    """The number the run records (rank 0 writes it), not each process's own mean."""
    assert read[1] == read[0]
