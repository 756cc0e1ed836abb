"""Mistakes found at setup, before the first step (issue 19, part 1): a metric read under a
name a typo away from one declared written, and a folder a pack cannot write. Each stops
the run before a step ran, with one error (no chained traceback) that names the fix."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import runmodel
from runmodel.core.metric_names import edit_distance
from runmodel.modes import Profile
from runmodel.packs import Checkpoint, EarlyStopping, Evaluate, LRSchedule, RunLog, TensorBoard

from helpers import Tiny


def counted(engine: runmodel.Engine) -> list[int]:
    """A list that holds the number of steps begun (``step_start`` calls)."""
    began = [0]
    engine.on("step_start", lambda e: began.__setitem__(0, began[0] + 1), writes=())
    return began


def refused(
    engine: runmodel.Engine, error: type[BaseException], model: Any = None, **run: Any
) -> str:
    """Run ``model`` (a classifier by default) for 2 epochs; it must end with ``error``
    before its first step, unchained. Its message."""
    began = counted(engine)
    with pytest.raises(error) as caught:
        engine.run(Tiny(classes=3) if model is None else model, epochs=2, **run)
    assert began == [0], "a step ran before the mistake was found"
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert "\n" not in str(caught.value)
    return str(caught.value)


# -- metric names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "who"),
    [
        (lambda: EarlyStopping("eval_acuracy", patience=2, mode="max"), "EarlyStopping"),
        (lambda: Checkpoint(tempfile.mkdtemp(), best=("eval_acuracy", "max")), "Checkpoint"),
        (
            lambda: LRSchedule(
                lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o),
                interval="epoch",
                metric="eval_acuracy",
            ),
            "LRSchedule",
        ),
    ],
)
def test_a_pack_reading_a_misspelt_metric_stops_the_run_with_a_did_you_mean(
    make: Callable[[], runmodel.Pack], who: str
) -> None:
    engine = runmodel.Engine()
    engine.attach(Evaluate(), make())
    message = refused(engine, ValueError)
    assert message.startswith(
        f"{who} reads the metric 'eval_acuracy', which nothing in this run writes. Did you "
        f"mean 'eval_accuracy' (written by Evaluate)? Declared: eval_accuracy, eval_loss, "
    )


@pytest.mark.parametrize(
    ("make", "who"),
    [
        (lambda: EarlyStopping("val_score", patience=2, mode="max"), "EarlyStopping"),
        (lambda: Checkpoint(tempfile.mkdtemp(), best=("val_score", "max")), "Checkpoint"),
        (
            lambda: LRSchedule(
                lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o),
                interval="epoch",
                metric="val_score",
            ),
            "LRSchedule",
        ),
    ],
)
def test_a_pack_reading_a_metric_nothing_writes_stops_the_run_at_setup(
    make: Callable[[], runmodel.Pack], who: str
) -> None:
    """Far from every declared name, and no hook of the user's that could write it
    undeclared: found before the first step, not after a whole epoch."""
    engine = runmodel.Engine()
    engine.attach(Evaluate(), make())
    message = refused(engine, ValueError)
    assert message.startswith(
        f"{who} reads the metric 'val_score', which nothing in this run writes. Declared: "
        f"eval_accuracy, eval_loss, "
    )


def test_a_hook_declares_what_it_reads_and_writes() -> None:
    engine = runmodel.Engine()
    engine.on("epoch_end", lambda e: e.state.metrics.update(val_loss=1.0), writes="val_loss")
    engine.on("epoch_end", lambda e: None, reads=["val_los"], name="watch", priority=-10)
    message = refused(engine, ValueError)
    assert message.startswith(
        "hook 'watch' reads the metric 'val_los', which nothing in this "
        "run writes. Did you mean 'val_loss' (written by hook '<lambda>')?"
    )


def test_an_undeclared_writer_close_to_a_declared_name_is_told_to_declare() -> None:
    # val_loss is one letter from Evaluate's eval_loss: written but not declared, it stops
    # the run, with the declaration that lets it go on
    engine = runmodel.Engine()
    engine.attach(Evaluate(), EarlyStopping("val_loss", patience=5))
    engine.on("epoch_end", lambda e: e.state.metrics.update(val_loss=1.0))
    message = refused(engine, ValueError)
    assert "Did you mean 'eval_loss' (written by Evaluate)?" in message
    assert message.endswith(
        "If a hook of yours writes 'val_loss', declare it: "
        "engine.on(phase, fn, writes=['val_loss']), or in a pack, "
        "writes = ['val_loss']"
    )

    declared = runmodel.Engine()
    declared.attach(Evaluate(), EarlyStopping("val_loss", patience=5))
    declared.on("epoch_end", lambda e: e.state.metrics.update(val_loss=1.0), writes="val_loss")
    assert declared.run(Tiny(classes=3), epochs=2).steps == 8


def test_a_name_far_from_every_declared_one_keeps_the_check_at_first_appearance() -> None:
    engine = runmodel.Engine()  # "score" is written without a declaration, and works
    engine.on("epoch_end", lambda e: e.state.metrics.update(score=1.0))
    engine.attach(EarlyStopping("score", patience=1))
    result = engine.run(Tiny(), epochs=3)
    assert result.ended == "stopped" and result.steps == 8


class LossEMA(runmodel.Pack):
    """A pack that declares what it writes, as docs/writing_packs.md shows."""

    writes = ("loss_ema",)

    def epoch_end(self, engine: runmodel.Engine) -> None:
        engine.state.metrics["loss_ema"] = float(engine.state.loss.detach())


class Watch(runmodel.Pack):
    """A pack that declares what it reads, set from its argument."""

    def __init__(self, metric: str) -> None:
        self.reads = [metric]
        self.seen: list[float] = []

    @runmodel.hook(priority=-10)
    def epoch_end(self, engine: runmodel.Engine) -> None:
        self.seen.append(engine.state.metrics[self.reads[0]])


def test_pack_declarations_are_compared() -> None:
    engine = runmodel.Engine()
    engine.attach(LossEMA(), Watch("loss_eam"))
    assert refused(engine, ValueError).startswith(
        "Watch reads the metric 'loss_eam', which nothing in this run writes. Did you mean "
        "'loss_ema' (written by LossEMA)?"
    )

    engine = runmodel.Engine()
    watch = Watch("loss_ema")
    engine.attach(LossEMA(), watch)
    engine.run(Tiny(), epochs=2)
    assert len(watch.seen) == 2


def test_the_step_declares_loss_and_loss_is_the_epochs_mean_loss() -> None:
    engine = runmodel.Engine()
    engine.attach(EarlyStopping("los", patience=1))
    assert "Did you mean 'loss' (written by the step)?" in refused(engine, ValueError)

    engine = runmodel.Engine()
    stopping = EarlyStopping("loss", patience=1)
    engine.attach(stopping)
    means: list[float] = []
    steps: list[float] = []
    engine.on("epoch_start", lambda e: steps.clear())
    engine.on("runstep", lambda e: steps.append(float(e.state.loss.detach())))
    engine.on("epoch_end", lambda e: means.append(sum(steps) / len(steps)))
    engine.run(Tiny(), epochs=2)
    assert stopping.best == pytest.approx(min(means), rel=1e-12)


def test_only_the_names_of_hooks_that_run_count() -> None:
    # EarlyStopping and Evaluate run in train runs only: an eval run ignores their names
    engine = runmodel.Engine()
    engine.attach(Evaluate(), EarlyStopping("eval_acuracy", patience=2))
    assert "accuracy" in engine.run(Tiny(classes=3), "eval").metrics


def test_eval_mode_declares_the_metrics_it_computes() -> None:
    engine = runmodel.Engine()
    engine.on("epoch_end", lambda e: None, reads="acuracy", modes="eval", name="report")
    began = counted(engine)
    with pytest.raises(
        ValueError,
        match=r"^hook 'report' reads the metric 'acuracy', .* Did "
        r"you mean 'accuracy' \(written by the step\)\?",
    ):
        engine.run(Tiny(classes=3), "eval")
    assert began == [0]


def test_declarations_are_checked_when_written() -> None:
    engine = runmodel.Engine()
    with pytest.raises(
        TypeError,
        match=r"writes= takes a metric name \(a key of "
        r"state.metrics, such as 'eval_loss'\) or a list",
    ):
        engine.on("epoch_end", lambda e: None, writes=3)  # type: ignore[arg-type]

    class Bad(runmodel.Pack):
        writes = (3,)  # type: ignore[assignment]

        def epoch_end(self, engine: runmodel.Engine) -> None: ...

    engine.attach(Bad())
    assert refused(engine, TypeError).startswith("Bad.writes= takes a metric name")


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("eval_accuracy", "eval_acuracy", 1),
        ("eval_loss", "eval_lsos", 1),
        ("loss", "lr", 3),
        ("", "abc", 3),
        ("val_loss", "eval_loss", 1),
        ("same", "same", 0),
    ],
)
def test_edit_distance(a: str, b: str, distance: int) -> None:
    assert edit_distance(a, b) == edit_distance(b, a) == distance


# -- folders ----------------------------------------------------------------------------------

PACKS: dict[str, Callable[[Path], runmodel.Pack]] = {
    "Checkpoint": lambda folder: Checkpoint(folder),
    "TensorBoard": lambda folder: TensorBoard(folder),
    "RunLog": lambda folder: RunLog(folder / "run.log"),
}


@contextlib.contextmanager
def read_only_folder() -> Iterator[Path]:
    """A folder this process cannot write to: mode 0o555, and, where the tests run as
    root (who may write anywhere), the effective user ``nobody`` meanwhile."""
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)  # nobody may pass through it
        folder = Path(top) / "read-only"
        folder.mkdir(mode=0o555)
        folder.chmod(
            stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
        )
        root = os.geteuid() == 0
        if root:
            os.seteuid(65534)
        try:
            yield folder
        finally:
            if root:
                os.seteuid(0)


@pytest.mark.parametrize("under", [True, False], ids=["under-a-file", "a-file"])
@pytest.mark.parametrize("pack", sorted(PACKS))
def test_a_file_on_the_folders_path_stops_the_run_naming_folder_and_pack(
    pack: str, under: bool, tmp_path: Path
) -> None:
    (tmp_path / "taken").write_text("a file where a folder would go")
    folder = tmp_path / "taken" / "deeper" if under else tmp_path / "taken"
    engine = runmodel.Engine()
    engine.attach(PACKS[pack](folder))
    message = refused(engine, OSError)
    assert message.startswith(
        f"{pack} cannot write to its folder '{folder}': "
        f"'{tmp_path / 'taken'}' is a file, not a folder; give {pack} a "
        f"folder it can create and write to"
    )


@pytest.mark.parametrize("pack", sorted(PACKS))
def test_a_read_only_folder_stops_the_run_naming_folder_and_pack(pack: str) -> None:
    with read_only_folder() as folder:
        engine = runmodel.Engine()
        engine.attach(PACKS[pack](folder / "out"))
        message = refused(engine, PermissionError)
    assert message.startswith(
        f"{pack} cannot write to its folder '{folder / 'out'}': no permission to write there"
    )


def test_the_folder_is_made_at_setup_and_left_empty(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "a" / "b"))
    engine.on("step_start", lambda e: e.stop("looked"))
    engine.run(Tiny(), epochs=1)
    assert (tmp_path / "a" / "b").is_dir()
    assert not list((tmp_path / "a" / "b").glob(".runmodel-write-check*"))


def test_profile_mode_checks_its_folder_too(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    message = refused(
        runmodel.Engine(), FileExistsError, Tiny(), mode=Profile(directory=tmp_path / "taken")
    )
    assert message.startswith(
        f"Profile cannot write to its folder '{tmp_path / 'taken'}': "
        f"'{tmp_path / 'taken'}' is a file, not a folder"
    )


# -- the refusal, typed -----------------------------------------------------------------------


def test_a_refusal_keeps_its_type_and_is_told_by_its_note_type_not_its_text() -> None:
    from runmodel.core.state import REFUSED, Refusal, refused_at_setup

    class Refuses(runmodel.Pack):
        def check_setup(self, engine: Any) -> None:
            raise ValueError("no")

    engine = runmodel.Engine(Refuses())
    with pytest.raises(ValueError) as caught:
        engine.run(Tiny(classes=3), epochs=1)
    assert type(caught.value) is ValueError and str(caught.value) == "no"
    assert refused_at_setup(caught.value)
    assert [n for n in caught.value.__notes__ if isinstance(n, Refusal)] == [REFUSED]
    same_words = ValueError("no")
    same_words.add_note(str(REFUSED))  # a note with the words alone is not the refusal
    assert not refused_at_setup(same_words)

    class FailsLater(runmodel.Pack):
        def epoch_end(self, engine: Any) -> None:
            raise ValueError("later")

    with pytest.raises(ValueError, match="later") as failed:
        runmodel.Engine(FailsLater()).run(Tiny(classes=3), epochs=1)
    assert not refused_at_setup(failed.value)  # a failure of the run, not a refusal
