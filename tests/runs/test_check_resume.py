"""``runmodel check-resume``: a run straight, the same run saved at step S, SIGKILLed in
step S+1 and resumed, each in a real process of its own, compared bit for bit.

Two real checks (each a few short processes): the digits example resumes exactly (exit
0), and a model whose dropout draws from a generator of its own, which no checkpoint
holds, does not (exit 1), the check naming that module, the first step and the first
tensor that differ. The rest is cheap: bad input refused before any process starts, the
choice of S, and how a rerun step's records are read.
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from runmodel.cli import main
from runmodel.runs.check_resume import Verdict, _first_module, choose_step

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

OWN_DROPOUT = textwrap.dedent('''
    """A small regression whose dropout draws from a generator of its own."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel


    class OwnDropout(nn.Module):
        """Dropout with its own generator: no checkpoint holds its state, so a resumed
        run draws the masks of step 1 again."""

        def __init__(self, p):
            super().__init__()
            self.p = p
            self.generator = torch.Generator().manual_seed(7)

        def forward(self, x):
            if not self.training:
                return x
            keep = torch.rand(x.shape, generator=self.generator) >= self.p
            return x * keep / (1 - self.p)


    class Noisy(runmodel.TorchModel):
        def __init__(self, device=None, init_options=None):
            super().__init__(device, init_options)
            torch.manual_seed(0)
            self.module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), OwnDropout(0.5),
                                        nn.Linear(8, 1))

        def setup(self, setup_options=None):
            x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
            self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-2)
            self.loss_fn = nn.MSELoss()
            self.train_data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)),
                                         batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(2))
''')


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's processes run two at a time: one thread each."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def digests(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_digits_example_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "check"
    code = main(
        [
            "check-resume",
            str(EXAMPLES / "digits.py"),
            "--steps",
            "6",
            "--at",
            "3",
            "--dir",
            str(folder),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "saved at step 3 (mid-epoch: epoch 0, 3rd step of it)" in out  # of 23
    assert "resumed: exact" in out and "bit-identical" in out
    assert "(saved in the run's first epoch: with --steps above an epoch's steps" in out
    # it was killed for real, in step 4, after its checkpoint at step 3 was on disk
    assert (folder / "killed-killed-rank0.txt").is_file()
    assert [r["step"] for r in digests(folder / "killed-digests-rank0.jsonl")] == [1, 2, 3]
    assert (folder / "interrupted" / "check-resume" / "ckpt-00000-0000000003.pt").is_file()
    straight = digests(folder / "straight-digests-rank0.jsonl")
    resumed = digests(folder / "resumed-digests-rank0.jsonl")
    assert [r["step"] for r in resumed] == [4, 5, 6]
    assert resumed == straight[3:]
    assert len({r["digest"] for r in straight}) == 6  # the weights change every step


def test_dropout_with_its_own_generator_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "noisy.py"
    source.write_text(OWN_DROPOUT)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    code = main(["check-resume", str(source), "--steps", "8"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    # chosen: mid-epoch, in an epoch after the first (4 steps an epoch)
    assert "saved at step 5 (mid-epoch: epoch 1, 1st step of it)" in out
    assert "resumed: NOT exact" in out
    assert "first step whose state differs: step 6 (the first after the resume)" in out
    assert (
        "step 6 run again in the straight and the resumed run: first module whose "
        "output differs: 2 (OwnDropout), given the same input" in out
    )
    assert "(2 modules before it agree)" in out  # the Linear and the ReLU
    assert "weights: 4 of 4 tensors differ, the first 0.weight" in out
    assert "the first exp_avg of 0.weight" in out  # Adam's state of that parameter
    assert "random generators" not in out  # the global ones are restored
    assert list(temporary.iterdir()) == []  # the runs' folder is gone


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--steps", "1"], "--steps 1: the check saves at a step S and kills the run in step S+1"),
        (["--steps", "6", "--at", "6"], "--at 6: save at a step from 1 to 5"),
        (["--at", "0"], "--at 0: save at a step from 1 to 19"),
        (["--backend", "fsdp"], "--backend fsdp is the backend of runs in several processes"),
    ],
)
def test_bad_input_is_refused_before_any_run(
    tmp_path: Path, options: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "check"
    code = main(["check-resume", str(EXAMPLES / "digits.py"), "--dir", str(folder), *options])
    assert code == 2
    assert said in capsys.readouterr().err
    assert not folder.exists()


def test_a_folder_holding_files_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "old.txt").write_text("")
    assert main(["check-resume", str(EXAMPLES / "digits.py"), "--dir", str(tmp_path)]) == 2
    assert f"--dir {tmp_path}: give a new or empty folder" in capsys.readouterr().err


def test_a_source_that_does_not_load_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "broken.py"
    source.write_text(
        "import runmodel\nclass M(runmodel.TorchModel):\n    pass\n"
        "raise ValueError('no data here')\n"
    )
    assert main(["check-resume", str(source), "--steps", "4"]) == 2
    assert "no data here" in capsys.readouterr().err


def _records(epochs: list[int]) -> list[dict[str, Any]]:
    return [{"step": n + 1, "epoch": e} for n, e in enumerate(epochs)]


@pytest.mark.parametrize(
    ("epochs", "chosen"),
    [
        ([0] * 20, 10),  # one epoch: the middle
        ([0] * 5 + [1] * 5, 6),  # the first mid-epoch step of epoch 1, nearest the middle
        ([0] * 4 + [1] * 4, 5),  # step 4 ends epoch 0: step 5 begins epoch 1
        ([0] * 7 + [1] * 2, 8),  # epoch 1's one mid-epoch step, far from the middle
        ([0, 1, 2, 3], 2),  # every step ends an epoch: the middle
        ([0, 0], 1),
        ([3] * 4 + [4] * 4, 5),  # a run resumed before: its first epoch is 3
    ],
)
def test_the_step_to_save_at_is_mid_epoch_near_the_middle(epochs: list[int], chosen: int) -> None:
    assert choose_step(_records(epochs)) == chosen


def _call(module: str, output: str, input_: str = "in", type_: str = "Linear") -> dict[str, str]:
    return {"module": module, "type": type_, "input": input_, "output": output}


def test_what_differs_first_in_a_step_run_again() -> None:
    calls = [_call("0", "a"), _call("1", "b", "a", "ReLU"), _call("", "c", type_="Sequential")]
    same = {"batch": "x", "calls": calls}
    line, module = _first_module(same, {"batch": "y", "calls": calls}) or ("", "")
    assert "its batch differs" in line and module is None
    changed = [calls[0], _call("1", "B", "a", "ReLU"), _call("", "C", type_="Sequential")]
    line, module = _first_module(same, {"batch": "x", "calls": changed}) or ("", "")
    assert line.startswith("first module whose output differs: 1 (ReLU), given the same input")
    assert module == "1"
    fed = [calls[0], _call("1", "B", "A", "ReLU"), _call("", "C", type_="Sequential")]
    line, module = _first_module(same, {"batch": "x", "calls": fed}) or ("", "")
    assert "first module whose input differs: 1 (ReLU)" in line
    assert "forward code of the model's module" in line
    line, module = _first_module(same, same) or ("", "")
    assert "every module's output agrees" in line and module is None


def test_findings_are_said_once_when_every_process_agrees_else_per_rank() -> None:
    verdict = Verdict("m.py", 6, 3, "mid-epoch: epoch 0, 3rd step of it", processes=2)
    verdict.found(1, "weights: 1 of 2 tensors differ, the first 0.weight", "state")
    verdict.found(1, "first step whose state differs: step 4")
    text = verdict.text()
    assert text.splitlines() == [
        "check-resume m.py: 6 steps; saved at step 3 (mid-epoch: epoch 0, 3rd step of it), "
        "killed in step 4, resumed: NOT exact",
        "  rank 1: first step whose state differs: step 4",  # the steps first
        "  rank 1: weights: 1 of 2 tensors differ, the first 0.weight",
    ]
    verdict.found(0, "weights: 1 of 2 tensors differ, the first 0.weight", "state")
    verdict.found(0, "first step whose state differs: step 4")
    assert verdict.text().splitlines()[1:] == [
        "  first step whose state differs: step 4",
        "  weights: 1 of 2 tensors differ, the first 0.weight",
        "  (the same in each of the 2 processes)",
    ]
