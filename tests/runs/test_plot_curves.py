"""``runmodel plot`` (``runmodel/runs/plot.py``): real config runs (``runmodel run CONFIG
--set ...``) with different learning rates, their curves read back from the TensorBoard
files they wrote, the figure checked line by line against the values each run logged in
its run.log, and the PNG on disk checked as a PNG of the figure's size; a script run's
events where its own TensorBoard pack wrote them; a sweep's figure."""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
import uuid
from pathlib import Path

import pytest

import warm as subprocess

pytest.importorskip("matplotlib")

import runmodel
import runmodel.cli
from runmodel.packs import TensorBoard
from runmodel.plot import (
    Curve,
    event_folders,
    figure,
    labels,
    load_runs,
    plot,
    read_curves,
    sweep_figure,
)
from runmodel.runs.plot import add_arguments, main

from helpers import dropout_mlp

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"}
PLOT = (sys.executable, "-m", "runmodel.plot")

MODEL = '''\
"""A 3-class linear classifier on 4 fixed batches (registered as {name!r})."""

import torch
from torch import nn

import runmodel


class Tiny(runmodel.TorchModel):
    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Linear(4, 3)

    def setup(self, setup_options=None):
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)  # the config's wins
        self.loss_fn = nn.CrossEntropyLoss()
        g = torch.Generator().manual_seed(1)
        x = torch.randn(32, 4, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        self.train_data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]
        self.eval_data = [(x[:16], y[:16]), (x[16:], y[16:])]


runmodel.register_model({name!r}, Tiny)
'''

CONFIG = """\
imports = ["tiny.py"]
epochs = 3
device = "cpu"

[model]
type = "{name}"

[optimizer]
type = "sgd"
args = {{ lr = 0.1 }}

[[packs]]
type = "tensorboard"
args = {{ every_steps = 2 }}

[[packs]]
type = "evaluate"
"""

#: --set options of each run, and the label each should get (lr and epochs differ)
RUNS = {
    ("optimizer.args.lr=0.05",): "epochs=3, lr=0.05",
    ("optimizer.args.lr=0.3",): "epochs=3, lr=0.3",
    ("optimizer.args.lr=0.3", "epochs=2"): "epochs=2, lr=0.3",
}
EPOCH_LINE = re.compile(r"epoch (\d+) step (\d+) (.*)")


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three config runs through the command (in-process), in a temporary folder."""
    folder = tmp_path_factory.mktemp("plot")
    name = f"tiny-plot-{uuid.uuid4().hex[:8]}"
    (folder / "tiny.py").write_text(MODEL.format(name=name))
    (folder / "config.toml").write_text(CONFIG.format(name=name))
    made = []
    for options in RUNS:
        before = set((folder / "runs").glob("*"))
        sets = [arg for option in options for arg in ("--set", option)]
        code = runmodel.cli.main(
            [
                "run",
                str(folder / "config.toml"),
                *sets,
                "--no-progress",
                "--runs-dir",
                str(folder / "runs"),
            ]
        )
        assert code == 0
        [new] = set((folder / "runs").glob("*")) - before
        made.append(new)
    return made


def logged(run_dir: Path) -> dict[str, tuple[list[int], list[float]]]:
    """What the run's run.log says at each epoch's end: steps and values by name."""
    found: dict[str, tuple[list[int], list[float]]] = {}
    for line in (run_dir / "run.log").read_text().splitlines():
        match = EPOCH_LINE.search(line)
        if match:
            words = match[3].split()
            for key, value in zip(words[::2], words[1::2], strict=True):
                steps, values = found.setdefault(key, ([], []))
                steps.append(int(match[2]))
                values.append(float(value))
    return found


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_train_and_eval_values_of_a_quantity_share_its_panel_a_colour_per_run(
    run_dirs: list[Path],
) -> None:
    fig = figure(run_dirs)
    # the loss first; the learning rates only when asked for; no train/ or eval_ prefix
    assert [axes.get_title() for axes in fig.axes] == ["loss", "loss per step", "accuracy"]
    assert [axes.get_ylabel() for axes in fig.axes] == ["loss", "loss", "accuracy"]
    loss, per_step, accuracy = fig.axes
    expected_labels = list(RUNS.values())
    assert [line.get_label() for line in loss.get_lines()] == [
        f"{label} ({kind})" for label in expected_labels for kind in ("train", "eval")
    ]
    assert [line.get_linestyle() for line in loss.get_lines()] == ["-", "--"] * 3
    colours = [line.get_color() for line in loss.get_lines()]
    assert colours[0::2] == colours[1::2] and len(set(colours)) == 3  # one colour per run
    for axes in (per_step, accuracy):
        assert [line.get_label() for line in axes.get_lines()] == expected_labels
        assert [line.get_color() for line in axes.get_lines()] == colours[0::2]
    for axes in fig.axes:
        shown = [line.get_label() for line in axes.get_lines()]
        assert [t.get_text() for t in axes.get_legend().get_texts()] == shown
        assert axes.get_xlabel() == "step"
        ticks = axes.get_xticks()  # steps are counts: whole-number ticks
        assert len(ticks) > 1 and all(float(tick).is_integer() for tick in ticks), ticks
    for index, (run_dir, epochs) in enumerate(zip(run_dirs, (3, 3, 2), strict=True)):
        log = logged(run_dir)
        assert set(log) == {"loss", "eval_loss", "eval_accuracy"}
        lines = {
            "loss": loss.get_lines()[2 * index],
            "eval_loss": loss.get_lines()[2 * index + 1],
            "eval_accuracy": accuracy.get_lines()[index],
        }
        for name, line in lines.items():
            steps, values = list(line.get_xdata()), list(line.get_ydata())
            assert steps == log[name][0] == [4 * (e + 1) for e in range(epochs)]
            assert values == pytest.approx(log[name][1], rel=1e-5)
        line = per_step.get_lines()[index]  # every 2nd step's loss, at 1-based steps
        steps, values = list(line.get_xdata()), list(line.get_ydata())
        assert steps == list(range(2, 4 * epochs + 1, 2))
        # the epochs' last steps; run.log has the epoch's mean loss, above its last step's
        # as the loss falls through each epoch here
        at_epoch_end = [values[steps.index(s)] for s in log["loss"][0]]
        assert all(mean > last for mean, last in zip(log["loss"][1], at_epoch_end, strict=True))
    # the runs differ: a faster learning rate ends at a lower loss here
    final = [loss.get_lines()[2 * i].get_ydata()[-1] for i in range(2)]
    assert final[1] < final[0]


def test_plot_writes_a_png_of_the_figure_size(run_dirs: list[Path], tmp_path: Path) -> None:
    path = plot(run_dirs, tmp_path / "sub" / "curves.png", metrics=["loss", "eval_accuracy"])
    assert path == tmp_path / "sub" / "curves.png"
    assert png_size(path) == (1000, 350)  # two 5 x 3.5 inch panels side by side at 100 dpi
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.shape[:2] == (350, 1000)
    assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[::37]}) > 10  # drawn
    # no suffix: a PNG
    assert plot(run_dirs[:1], tmp_path / "one").name == "one.png"


def test_metrics_choose_the_panels_in_their_order(run_dirs: list[Path]) -> None:
    fig = figure(run_dirs, ["eval_accuracy", "lr/group0"])
    assert [axes.get_title() for axes in fig.axes] == ["accuracy", "learning rate, group0"]
    assert [axes.get_ylabel() for axes in fig.axes] == ["accuracy", "learning rate"]
    rates = [list(line.get_ydata()) for line in fig.axes[1].get_lines()]
    assert rates == [pytest.approx([0.05] * 3), pytest.approx([0.3] * 3), pytest.approx([0.3] * 2)]


def test_one_run_is_labelled_by_its_name(run_dirs: list[Path]) -> None:
    fig = figure([run_dirs[0], run_dirs[0]])  # the same run twice counts once
    loss, per_step, accuracy = fig.axes
    for axes in (per_step, accuracy):
        assert [line.get_label() for line in axes.get_lines()] == [run_dirs[0].name]
        assert axes.get_legend() is None
    # one run's train and eval loss: told apart by the legend
    assert [line.get_label() for line in loss.get_lines()] == ["train", "eval"]
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["train", "eval"]


def test_labels_say_what_differs() -> None:
    a = {
        "model": {"type": "mlp", "args": {"hidden": 128}},
        "optimizer": {"args": {"lr": 0.01}},
        "seed": 0,
    }
    b = {
        "model": {"type": "mlp", "args": {"hidden": 256}},
        "optimizer": {"args": {"lr": 0.01}},
        "seed": 0,
    }
    c = {
        "model": {"type": "mlp", "args": {"hidden": 256, "lr": 1}},
        "optimizer": {"args": {"lr": 0.1}},
        "seed": 0,
    }
    assert labels([a, b], ["ra", "rb"]) == ["hidden=128", "hidden=256"]
    # two keys end in "lr": each is named by the shortest ending that tells them apart
    assert labels([a, c], ["ra", "rc"]) == [
        "hidden=128, model.args.lr=-, optimizer.args.lr=0.01",
        "hidden=256, model.args.lr=1, optimizer.args.lr=0.1",
    ]
    # nothing differs, or two runs alike among others: their names
    assert labels([a, a], ["ra", "ra2"]) == ["ra", "ra2"]
    assert labels([a, a, b], ["x", "y", "z"]) == ["x", "y", "hidden=256"]


def test_a_resumed_runs_repeated_steps_count_once(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    first = SummaryWriter(str(tmp_path), filename_suffix=".1")
    for step in (1, 2, 3, 4):
        first.add_scalar("train/loss", 10.0 + step, step, walltime=100.0 + step)
    first.close()
    second = SummaryWriter(str(tmp_path), filename_suffix=".2")  # resumed from step 2
    for step in (3, 4, 5):
        second.add_scalar("train/loss", 20.0 + step, step, walltime=200.0 + step)
    second.close()
    assert len(list(tmp_path.glob("*tfevents*"))) == 2
    curve = read_curves(tmp_path)["train/loss"]
    assert curve.steps == (1, 2, 3, 4, 5)
    assert curve.values == (11.0, 12.0, 23.0, 24.0, 25.0)


def test_bad_input_is_a_one_line_error_naming_what_is_there(
    run_dirs: list[Path], tmp_path: Path
) -> None:
    root = run_dirs[0].parent
    with pytest.raises(
        ValueError,
        match=r"is not a run directory but holds 3 runs: give "
        r"them, as in `runmodel plot .*/\*`",
    ):
        load_runs([root])
    with pytest.raises(
        ValueError,
        match=r"checkpoint is not a run directory \(no config.json "
        r"or run.json; it holds nothing\)",
    ):
        (tmp_path / "checkpoint").mkdir()
        load_runs([tmp_path / "checkpoint"])
    with pytest.raises(ValueError, match=r"does not exist"):
        load_runs([tmp_path / "nowhere"])
    with pytest.raises(ValueError, match=r"give at least one run directory"):
        load_runs([])
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"epochs": 1}))
    with pytest.raises(ValueError, match=r"has no TensorBoard events in .*bare/tensorboard"):
        load_runs([bare])
    with pytest.raises(ValueError) as raised:
        figure(run_dirs, ["loss", "accuracy", "f1"])
    assert str(raised.value) == (
        "no run has 'accuracy', 'f1'; the runs have train/loss, "
        "train/loss_step, train/eval_loss, train/eval_accuracy, "
        "lr/group0"
    )


def test_the_command_prints_the_path(run_dirs: list[Path], tmp_path: Path) -> None:
    done = subprocess.run(
        [*PLOT, *map(str, run_dirs), "-o", "runs.png", "--metrics", "loss, eval_loss"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "runs.png\n", "")
    assert png_size(tmp_path / "runs.png") == (500, 350)  # train and eval loss: one panel


def test_the_command_says_what_is_wrong_in_one_line(
    run_dirs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    output = tmp_path / "plot.png"
    args = parser.parse_args([str(run_dirs[0]), "--metrics", "acc", "-o", str(output)])
    assert main(args) == 2
    assert capsys.readouterr() == (
        "",
        "runmodel plot: error: no run has 'acc'; the runs have "
        "train/loss, train/loss_step, train/eval_loss, "
        "train/eval_accuracy, lr/group0\n",
    )
    assert not output.exists()
    with pytest.raises(SystemExit):
        parser.parse_args([str(run_dirs[0]), "--metrics", " , "])
    assert "give metric names, as in --metrics loss,eval_accuracy" in capsys.readouterr().err


def test_runmodel_plot_in_the_command(
    run_dirs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.png"
    assert runmodel.cli.main(["plot", *map(str, run_dirs), "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    assert png_size(out) == (1000, 700)
    assert runmodel.cli.main(["plot", str(tmp_path)]) == 2
    assert "is not a run directory" in capsys.readouterr().err


# -- where a run's events are ------------------------------------------------------------------


def test_a_script_runs_events_are_found_where_its_tensorboard_pack_wrote_them(
    tmp_path: Path,
) -> None:
    """A script run whose own TensorBoard pack writes to ``tb`` (relative: inside the run
    folder), not the default ``tensorboard/``."""
    engine = runmodel.Engine(progress=False)
    engine.attach(TensorBoard("tb"))
    engine.run(dropout_mlp(), epochs=2, run_dir=tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.is_dir()) == ["tb"]
    assert event_folders(tmp_path / "run") == [tmp_path / "run" / "tb"]
    [loss] = figure([tmp_path / "run"]).axes
    assert loss.get_title() == "loss"
    assert list(loss.get_lines()[0].get_xdata()) == [4, 8]  # 4 batches an epoch


def test_the_run_record_names_event_folders_outside_the_run_folder(tmp_path: Path) -> None:
    """``run.json``'s ``"tensorboard"``: the folders a run's TensorBoard packs wrote to,
    relative to the run folder or absolute (a pack given an absolute folder)."""
    from torch.utils.tensorboard import SummaryWriter

    elsewhere, run_dir = tmp_path / "logs" / "tb", tmp_path / "runs" / "a"
    run_dir.mkdir(parents=True)
    writer = SummaryWriter(str(elsewhere))
    for step in (4, 8):
        writer.add_scalar("train/loss", 1.0 / step, step)
    writer.close()
    (run_dir / "tensorboard").mkdir()  # empty: the record wins, not this
    for named in (str(elsewhere), [str(elsewhere)], "../../logs/tb"):
        (run_dir / "run.json").write_text(
            json.dumps({"script": str(tmp_path / "train.py"), "argv": [], "tensorboard": named})
        )
        [found] = event_folders(run_dir)
        assert found.resolve() == elsewhere
        curve = load_runs([run_dir])[0].curves["train/loss"]
        assert curve == Curve((4, 8), (pytest.approx(0.25), pytest.approx(0.125)))


# -- a sweep's figure ----------------------------------------------------------------------------


def test_a_sweeps_categorical_axis_is_sorted_and_counts_have_whole_number_ticks(
    tmp_path: Path,
) -> None:
    """Trials that drew a choice out of order: the axis lists the choices in order, and
    an ``int`` space and the trial count have whole-number ticks."""
    folder = tmp_path / "search"
    folder.mkdir()
    (folder / "sweep.json").write_text(
        json.dumps(
            {
                "metric": "eval_accuracy",
                "direction": "max",
                "params": {
                    "optimizer.args.lr": {"choice": [0.3, 0.01, 0.1]},
                    "model.args.hidden": {"int": [16, 19]},
                },
            }
        )
    )
    drawn = [(0.3, 17, 0.5), (0.01, 16, 0.7), (0.1, 19, 0.6), (0.01, 18, 0.8)]
    for number, (lr, hidden, accuracy) in enumerate(drawn):
        trial = folder / f"trial-{number}"
        trial.mkdir()
        (trial / "config.json").write_text(
            json.dumps(
                {
                    "model": {"type": "tiny", "args": {"hidden": hidden}},
                    "optimizer": {"type": "sgd", "args": {"lr": lr}},
                }
            )
        )
        (trial / "metrics.json").write_text(json.dumps({"metrics": {"eval_accuracy": accuracy}}))
        (trial / "status.json").write_text(
            json.dumps({"status": "finished", "started": 100.0 + number})
        )
    lr, hidden, best = sweep_figure(folder).axes
    assert [label.get_text() for label in lr.get_xticklabels()] == ["0.01", "0.1", "0.3"]
    positions = [tuple(p) for p in lr.collections[0].get_offsets()]
    assert positions == [(2, 0.5), (0, 0.7), (1, 0.6), (0, 0.8)]  # each at its choice
    for axes in (hidden, best):
        ticks = axes.get_xticks()
        assert len(ticks) > 1 and all(float(t).is_integer() for t in ticks), ticks
    assert [list(line.get_ydata()) for line in best.get_lines()] == [[0.5, 0.7, 0.7, 0.8]]
