"""A SIGKILL in the middle of an async sharded save (torchrun, 2 gloo processes, CPU):
both processes die in the background write of epoch 2's checkpoint, once their shards
are written and before the processes agree on it. Epoch 1's checkpoint stays whole,
epoch 2's never becomes visible, and the run resumed from the folder ends with the
weights of the run that was never killed, bit for bit."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import warm as subprocess

LIMIT_S = 300

CHILD = textwrap.dedent("""
    import os
    import signal
    import sys

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.checkpoint.sharded import saving
    from runmodel.packs import Checkpoint

    out, kill = sys.argv[1], sys.argv[2] == "kill"


    class Net(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            torch.manual_seed(0)
            self.module = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 3))

        def setup(self, setup_options=None):
            g = torch.Generator().manual_seed(1)
            x, y = torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)
            self.train_data = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
            self.optimizer = torch.optim.Adam(self.module.parameters(), lr=0.01)
            self.loss_fn = nn.CrossEntropyLoss()


    if kill:  # in the background write of epoch 2's save: shards written, not agreed on
        agree = saving.agree

        def killed(failure, sharded, staging, path):
            if path.name.startswith("ckpt-00002"):
                os.kill(os.getpid(), signal.SIGKILL)
            agree(failure, sharded, staging, path)

        saving.agree = killed

    engine = runmodel.Engine()
    engine.attach(Checkpoint(f"{out}/ckpt", every="1ep", keep=None, async_save=True))
    engine.run(Net(), epochs=3, backend="fsdp", resume="auto")

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(
        engine.model.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if engine.state.rank == 0:
        torch.save(weights, f"{out}/final.pt")
""")


def torchrun(root: Path, out: Path, how: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    env.pop("TORCHELASTIC_RUN_ID", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return subprocess.Popen(
        [*command, "--nproc-per-node", "2", str(root / "child.py"), str(out), how],
        cwd=root,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        _, err = process.communicate()
    return process.returncode, err


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    root = tmp_path_factory.mktemp("fsdp_async_kill")
    (root / "child.py").write_text(CHILD)
    straight, killed = torchrun(root, root / "straight", "straight"), None
    try:
        killed = torchrun(root, root / "killed", "kill")
        results: dict[str, object] = {"straight": finish(straight), "killed": finish(killed)}
        ckpt = root / "killed" / "ckpt"
        results["after_kill"] = sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else []
        results["resumed"] = finish(torchrun(root, root / "killed", "resume"))
        results["root"] = root
        yield results
    finally:
        for process in (straight, killed):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, 9)


def test_the_kill_leaves_the_checkpoint_before_it_whole(runs: dict[str, object]) -> None:
    code, err = runs["killed"]  # type: ignore[misc]
    assert code != 0, err[-3000:]
    names = runs["after_kill"]
    assert isinstance(names, list)
    assert [n for n in names if n.startswith("ckpt-")] == ["ckpt-00001-0000000008"], names
    assert any(n.startswith(".ckpt-00002") for n in names), names  # its staging folder
    first = runs["root"] / "killed" / "ckpt" / "ckpt-00001-0000000008"  # type: ignore[operator]
    assert sorted(p.name for p in first.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "run-0.pt",
        "run-1.pt",
    ]


def test_the_resumed_run_ends_with_the_straight_runs_weights(runs: dict[str, object]) -> None:
    for name in ("straight", "resumed"):
        code, err = runs[name]  # type: ignore[misc]
        assert code == 0, (name, err[-3000:])
    root = runs["root"]
    assert isinstance(root, Path)
    straight = torch.load(root / "straight" / "final.pt", weights_only=True)
    resumed = torch.load(root / "killed" / "final.pt", weights_only=True)
    assert straight.keys() == resumed.keys()
    for key, value in straight.items():
        assert torch.equal(value, resumed[key]), key
    names = sorted(p.name for p in (root / "killed" / "ckpt").iterdir())
    assert not any(n.startswith(".ckpt-") for n in names), names  # the stale one went
    assert "ckpt-00003-0000000024" in names, names
