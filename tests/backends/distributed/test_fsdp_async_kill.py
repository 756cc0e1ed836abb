"""A SIGKILL in the middle of an async sharded save (torchrun, 2 gloo processes, CPU):
both training processes are killed while their writer processes write epoch 2's
checkpoint, once the shards are written and before the processes agree on it. The writer
processes die with them; epoch 1's checkpoint stays whole, epoch 2's never becomes
visible, and the run resumed from the folder ends with the weights of the run that was
never killed, bit for bit."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import warm as subprocess

LIMIT_S = 300

CHILD = textwrap.dedent("""
    import sys
    import textwrap

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.checkpoint.sharded import process
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


    # in each writer process, at epoch 2's save (its shards written, not agreed on): it
    # kills its training process, and waits to die with it
    KILL = f'''
    import os, signal, time
    from runmodel.checkpoint.sharded import saving
    agree = saving.agree
    def killed(failure, sharded, staging, path):
        if path.name.startswith("ckpt-00002"):
            with open(f"{out}/writer-{{sharded.rank}}.pid", "w") as file:
                file.write(str(os.getpid()))
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(60)
        agree(failure, sharded, staging, path)
    saving.agree = killed
    '''
    if kill:
        process._SERVE = textwrap.dedent(KILL) + process._SERVE

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


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether the process ``pid`` ended (or is a zombie no one reaped) within ``within``
    seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


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
        results["writers_gone"] = [
            gone(int((root / "killed" / f"writer-{rank}.pid").read_text())) for rank in (0, 1)
        ]
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
    assert runs["writers_gone"] == [True, True]  # each writer process died with its trainer
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
