"""The run itself: phase order, the step budget, run controls, errors and teardown."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

import runmodel

from helpers import Counting, record_all

# -- phase order ------------------------------------------------------------------------


def test_implicit_epoch_phase_order(engine: runmodel.Engine) -> None:
    log: list[str] = []
    record_all(engine, log)
    model = Counting(batches=2, use_epochs=False)
    result = engine.run(model)
    assert log == [
        "setup@0.0",
        "epoch_start@0.0",
        "step_start@0.0",
        "runstep@0.0",
        "step_start@0.1",
        "runstep@0.1",
        "epoch_end@0.2",
        "teardown@1.2",
    ]
    assert (result.ended, result.steps, result.epochs) == ("completed", 2, 1)
    assert model.calls == ["model.setup", "model.run", "model.teardown"]


def test_explicit_epochs_phase_order(engine: runmodel.Engine) -> None:
    log: list[str] = []
    record_all(engine, log)
    model = Counting(batches=2)
    engine.on("teardown", lambda e: model.calls.append("teardown hook"))
    result = engine.run(model, epochs=2)
    assert log == [
        "setup@0.0",
        "epoch_start@0.0",
        "step_start@0.0",
        "runstep@0.0",
        "step_start@0.1",
        "runstep@0.1",
        "epoch_end@0.2",
        "epoch_start@1.2",
        "step_start@1.2",
        "runstep@1.2",
        "step_start@1.3",
        "runstep@1.3",
        "epoch_end@1.4",
        "teardown@2.4",
    ]
    assert model.seen == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert model.calls == ["model.setup", "model.run", "teardown hook", "model.teardown"]
    assert (result.ended, result.steps, result.epochs) == ("completed", 4, 2)


def test_epoch_step_resets_each_epoch(engine: runmodel.Engine) -> None:
    seen: list[tuple[int, int]] = []
    engine.on("runstep", lambda e: seen.append((e.state.epoch, e.state.epoch_step)))
    engine.run(Counting(batches=3), epochs=2)
    assert seen == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_runstep_returns_output_and_carries_run_facts(engine: runmodel.Engine) -> None:
    got: dict[str, Any] = {}

    class Probe(Counting):
        def run(
            self, runstep: runmodel.RunStep, steps: int | None = None, *a: Any, **k: Any
        ) -> None:
            got.update(
                out=runstep("x"), mode=runstep.mode, steps=runstep.steps, engine=runstep.engine
            )

    engine.run(Probe(), mode="eval", steps=5)
    assert got == {"out": "x", "mode": "eval", "steps": 5, "engine": engine}


# -- the step budget --------------------------------------------------------------------


class Forever(runmodel.Model):
    """A loop that never counts its steps, optionally behind ``except Exception``."""

    def __init__(self, swallow: bool = False) -> None:
        super().__init__()
        self.swallow, self.steps_run, self.after_loop = swallow, 0, False

    def step(self, batch: Any) -> None:
        self.steps_run += 1

    def run(self, runstep: runmodel.RunStep, steps: int | None = None, *a: Any, **k: Any) -> None:
        i = 0
        while True:
            try:
                runstep(i)
            except Exception:  # a careless model: must not swallow the engine's stop
                if not self.swallow:
                    raise
            i += 1
        self.after_loop = True  # pragma: no cover - never reached


@pytest.mark.parametrize("swallow", [False, True])
def test_budget_stops_a_loop_that_never_counts(engine: runmodel.Engine, swallow: bool) -> None:
    model = Forever(swallow=swallow)
    epochs_ended: list[int] = []
    engine.on("epoch_end", lambda e: epochs_ended.append(e.state.epoch))
    result = engine.run(model, steps=7)
    assert model.steps_run == 7 and result.steps == 7
    assert result.ended == "budget"
    assert epochs_ended == [0]  # the implicit epoch is closed once


def test_stop_run_is_not_an_exception() -> None:
    assert not issubclass(runmodel.StopRun, Exception)
    assert issubclass(runmodel.StopRun, BaseException)


def test_budget_mid_epoch_closes_the_partial_epoch(engine: runmodel.Engine) -> None:
    ends: list[tuple[int, int]] = []
    engine.on("epoch_end", lambda e: ends.append((e.state.epoch, e.state.epoch_step)))
    model = Counting(batches=3)
    result = engine.run(model, steps=7)  # epochs=None: as many as the budget needs
    assert ends == [(0, 3), (1, 3), (2, 1)]
    assert (result.steps, result.epochs, result.ended) == (7, 2, "budget")
    assert len(model.seen) == 7


def test_budget_on_an_epoch_boundary_starts_no_empty_epoch(engine: runmodel.Engine) -> None:
    starts: list[int] = []
    engine.on("epoch_start", lambda e: starts.append(e.state.epoch))
    result = engine.run(Counting(batches=3), steps=6)
    assert starts == [0, 1]
    assert (result.steps, result.epochs, result.ended) == (6, 2, "budget")


def test_exact_budget_lets_the_loop_finish(engine: runmodel.Engine) -> None:
    model = Counting(batches=5, use_epochs=False)
    result = engine.run(model, steps=5)
    assert result.ended == "completed" and result.steps == 5


def test_epochs_limit(engine: runmodel.Engine) -> None:
    result = engine.run(Counting(batches=2), epochs=3, steps=100)
    assert (result.steps, result.epochs, result.ended) == (6, 3, "completed")


def test_zero_steps_runs_nothing_but_setup_and_teardown(engine: runmodel.Engine) -> None:
    log: list[str] = []
    record_all(engine, log)
    model = Counting(batches=3)
    engine.run(model, steps=0)
    assert log == ["setup@0.0", "teardown@0.0"]
    assert model.seen == []


def test_empty_data_with_unbounded_epochs_is_an_error(engine: runmodel.Engine) -> None:
    with pytest.raises(
        RuntimeError, match=r"epoch 0 drew no batch: Counting.run\(\) made no runstep call"
    ):
        engine.run(Counting(batches=0), steps=10)


# -- run controls -----------------------------------------------------------------------


def test_stop_finishes_the_current_step(engine: runmodel.Engine) -> None:
    after: list[int] = []

    @engine.on("runstep", priority=1)
    def stop_at_two(engine: runmodel.Engine) -> None:
        if engine.state.step == 2:
            engine.stop()

    engine.on("runstep", lambda e: after.append(e.state.step))  # same step, later hook
    ends: list[int] = []
    engine.on("epoch_end", lambda e: ends.append(e.state.epoch))
    model = Counting(batches=10)
    result = engine.run(model, epochs=3)
    assert after == [0, 1, 2]
    assert len(model.seen) == 3
    assert ends == [0]
    assert (result.ended, result.steps, result.epochs) == ("stopped", 3, 0)


def test_stop_at_epoch_end_like_early_stopping(engine: runmodel.Engine) -> None:
    engine.on("epoch_end", lambda e: e.stop(), when=lambda e: e.state.epoch == 1)
    result = engine.run(Counting(batches=2), epochs=5)
    assert (result.ended, result.steps, result.epochs) == ("stopped", 4, 2)


def test_stop_at_epoch_start_pairs_the_epoch_end(engine: runmodel.Engine) -> None:
    log: list[str] = []
    engine.on("epoch_start", lambda e: e.stop(), when=lambda e: e.state.epoch == 1)
    record_all(engine, log)
    result = engine.run(Counting(batches=1), epochs=5)
    assert log == [
        "setup@0.0",
        "epoch_start@0.0",
        "step_start@0.0",
        "runstep@0.0",
        "epoch_end@0.1",
        "epoch_start@1.1",
        "epoch_end@1.1",
        "teardown@1.1",
    ]
    assert (result.ended, result.epochs) == ("stopped", 1)


def test_stop_with_implicit_epoch(engine: runmodel.Engine) -> None:
    engine.on("runstep", lambda e: e.stop(), once=2)
    result = engine.run(Counting(batches=10, use_epochs=False))
    assert (result.ended, result.steps) == ("stopped", 3)


def test_end_epoch_drops_the_rest_of_the_epoch(engine: runmodel.Engine) -> None:
    engine.on(
        "runstep",
        lambda e: e.end_epoch(),
        when=lambda e: e.state.epoch == 0 and e.state.epoch_step == 1,
    )
    model = Counting(batches=4)
    result = engine.run(model, epochs=2)
    assert model.seen == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert (result.steps, result.epochs, result.ended) == (6, 2, "completed")


def test_end_epoch_without_epochs_ends_the_run(engine: runmodel.Engine) -> None:
    engine.on("runstep", lambda e: e.end_epoch(), once=1)
    model = Counting(batches=5, use_epochs=False)
    assert engine.run(model).steps == 2


def test_skip_step_drops_the_batch(engine: runmodel.Engine) -> None:
    ran: list[Any] = []
    starts: list[Any] = []

    @engine.on("step_start", priority=1)
    def skip_odd(engine: runmodel.Engine) -> None:
        if engine.state.batch % 2:
            engine.skip_step()

    engine.on("step_start", lambda e: starts.append(e.state.batch))  # still fires
    engine.on("runstep", lambda e: ran.append((e.state.batch, e.state.step)))
    model = Counting(batches=5, use_epochs=False)
    result = engine.run(model)
    assert model.seen == [0, 2, 4]
    assert ran == [(0, 0), (2, 1), (4, 2)]
    assert starts == [0, 1, 2, 3, 4]
    assert (result.steps, result.skipped) == (3, 2)


def test_skipped_steps_do_not_spend_the_budget(engine: runmodel.Engine) -> None:
    engine.on("step_start", lambda e: e.skip_step(), when=lambda e: e.state.batch < 3)
    model = Forever()
    result = engine.run(model, steps=4)
    assert (model.steps_run, result.steps, result.skipped) == (4, 4, 3)


def test_skip_step_outside_step_start_is_an_error(engine: runmodel.Engine) -> None:
    engine.on("runstep", lambda e: e.skip_step(), name="skipper")
    with pytest.raises(RuntimeError, match="only a step_start hook") as info:
        engine.run(Counting(batches=2))
    assert "phase 'runstep', hook 'skipper'" in "\n".join(info.value.__notes__)


# -- errors and teardown ------------------------------------------------------------------


def test_error_in_a_hook_names_phase_and_hook(engine: runmodel.Engine) -> None:
    seen_errors: list[BaseException | None] = []
    torn: list[str] = []

    @engine.on("runstep", name="boom")
    def boom(engine: runmodel.Engine) -> None:
        if engine.state.step == 3:
            raise ValueError("bad value at step 3")

    engine.on("exception", lambda e: seen_errors.append(e.state.error))
    engine.on("teardown", lambda e: torn.append("hook"))
    model = Counting(batches=10)
    with pytest.raises(ValueError, match="bad value at step 3") as info:
        engine.run(model, epochs=1)
    note = "\n".join(info.value.__notes__)
    assert "phase 'runstep', hook 'boom'" in note and "test_engine.py" in note
    assert "step 3" in note
    assert seen_errors == [info.value]
    assert torn == ["hook"] and model.calls[-1] == "model.teardown"


@pytest.mark.parametrize(
    ("where", "expected"),
    [("setup", "model.setup"), ("run", "model.run"), ("step", "phase 'runstep' (built-in action)")],
)
def test_error_in_the_model_names_where(engine: runmodel.Engine, where: str, expected: str) -> None:
    class Broken(Counting):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            super().setup(setup_options)
            if where == "setup":
                raise OSError("no data")

        def run(
            self, runstep: runmodel.RunStep, steps: int | None = None, *a: Any, **k: Any
        ) -> None:
            if where == "run":
                raise OSError("no data")
            super().run(runstep, steps)

        def step(self, batch: Any) -> Any:
            if where == "step":
                raise OSError("no data")

    model = Broken()
    with pytest.raises(OSError, match="no data") as info:
        engine.run(model)
    assert expected in "\n".join(info.value.__notes__)
    assert model.calls[-1] == "model.teardown"


def test_keyboard_interrupt_tears_down_and_propagates(engine: runmodel.Engine) -> None:
    model = Counting(batches=10)
    seen: list[Any] = []
    engine.on("runstep", lambda e: (_ for _ in ()).throw(KeyboardInterrupt), once=1)
    engine.on("exception", lambda e: seen.append(type(e.state.error)))
    with pytest.raises(KeyboardInterrupt):
        engine.run(model)
    assert seen == [KeyboardInterrupt]
    assert model.calls[-1] == "model.teardown"


def test_teardown_hook_errors(engine: runmodel.Engine) -> None:
    model = Counting(batches=1)
    ran: list[str] = []
    engine.on("teardown", lambda e: 1 / 0, priority=1, name="bad_teardown")
    engine.on("teardown", lambda e: ran.append("later hook"))
    with pytest.raises(ZeroDivisionError) as info:
        engine.run(model)
    assert ran == ["later hook"] and model.calls[-1] == "model.teardown"
    assert "phase 'teardown'" in "\n".join(info.value.__notes__)


def test_original_error_wins_over_teardown_and_exception_errors(engine: runmodel.Engine) -> None:
    model = Counting(batches=2)
    engine.on("runstep", lambda e: 1 / 0)
    engine.on("exception", lambda e: {}["missing"])
    engine.on("teardown", lambda e: [][1])
    with pytest.raises(ZeroDivisionError) as info:
        engine.run(model)
    notes = "\n".join(info.value.__notes__)
    assert "KeyError" in notes and "IndexError" in notes
    assert model.calls[-1] == "model.teardown"


def test_no_teardown_when_setup_never_began(engine: runmodel.Engine) -> None:
    model = Counting()
    with pytest.raises(ValueError, match="unknown mode"):
        engine.run(model, mode="fly")
    assert model.calls == []


def test_engine_is_reusable_after_an_error(engine: runmodel.Engine) -> None:
    handle = engine.on("runstep", lambda e: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        engine.run(Counting(batches=1))
    handle.detach()
    result = engine.run(Counting(batches=2))
    assert (result.ended, result.steps) == ("completed", 2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "training"}, ValueError, "valid modes: train, eval"),
        ({"steps": -1}, ValueError, "steps= must be a whole number"),
        ({"epochs": 1.5}, ValueError, "epochs= must be a whole number"),
        ({"setup_options": ["lr"]}, TypeError, "setup_options must be a dict"),
    ],
)
def test_bad_run_arguments(
    engine: runmodel.Engine, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        engine.run(Counting(), **kwargs)


def test_nested_run_is_an_error(engine: runmodel.Engine) -> None:
    engine.on("setup", lambda e: e.run(Counting()))
    with pytest.raises(RuntimeError, match="running already"):
        engine.run(Counting())


def test_epochs_after_implicit_steps_is_an_error(engine: runmodel.Engine) -> None:
    class Late(Counting):
        def run(
            self, runstep: runmodel.RunStep, steps: int | None = None, *a: Any, **k: Any
        ) -> None:
            runstep(0)
            for _ in runstep.epochs():
                pass

    with pytest.raises(RuntimeError, match=r"runstep\.epochs"):
        engine.run(Late())


# -- resume: counters carry over, and filters agree with a straight run -------------------


def _fired(engine: runmodel.Engine) -> dict[str, list[int]]:
    fired: dict[str, list[int]] = {"steps": [], "epochs": []}
    engine.on("runstep", lambda e: fired["steps"].append(e.state.step), every=5)
    engine.on("epoch_end", lambda e: fired["epochs"].append(e.state.epoch), every="2ep")
    return fired


def test_resumed_counters_and_filters_match_a_straight_run() -> None:
    straight = runmodel.Engine()
    fired = _fired(straight)
    straight.run(Counting(batches=3), epochs=4)
    assert fired == {"steps": [4, 9], "epochs": [1, 3]}

    first = runmodel.Engine()
    fired_first = _fired(first)
    first.run(Counting(batches=3), epochs=2)
    resumed = runmodel.Engine()
    fired_resumed = _fired(resumed)
    resumed.load_state_dict(first.state_dict())
    result = resumed.run(Counting(batches=3), epochs=4)
    assert fired_first["steps"] + fired_resumed["steps"] == fired["steps"]
    assert fired_first["epochs"] + fired_resumed["epochs"] == fired["epochs"]
    assert (result.steps, result.epochs) == (12, 4)


# -- memory -----------------------------------------------------------------------------


def test_memory_stays_flat_over_200k_steps_with_10_hooks(engine: runmodel.Engine) -> None:
    marks: dict[int, int] = {}
    for n in range(9):
        engine.on("runstep", lambda e: None, name=f"noop{n}")

    @engine.on("runstep", every=20_000)
    def measure(engine: runmodel.Engine) -> None:
        marks[engine.state.step + 1] = tracemalloc.get_traced_memory()[0]

    class Quiet(runmodel.Model):
        def step(self, batch: Any) -> Any:
            return batch

        def run(
            self, runstep: runmodel.RunStep, steps: int | None = None, *a: Any, **k: Any
        ) -> None:
            for b in range(200_000):
                runstep(b)

    tracemalloc.start()
    try:
        result = engine.run(Quiet())
    finally:
        tracemalloc.stop()
    assert result.steps == 200_000 and len(marks) == 10
    growth = [marks[n] - marks[20_000] for n in sorted(marks)]
    assert max(growth) < 16 * 1024, growth  # a few stray ints and frames, no history


# -- regressions found in review ------------------------------------------------------------


def test_an_implicit_epoch_respects_the_epochs_limit(engine: runmodel.Engine) -> None:
    model = Counting(batches=5, use_epochs=False)
    result = engine.run(model, epochs=0)
    assert (result.steps, len(model.seen)) == (0, 0)
    engine.load_state_dict({"counters": {"step": 5, "epoch": 1}})  # a finished epoch
    model = Counting(batches=5, use_epochs=False)
    result = engine.run(model, epochs=1)
    assert (result.steps, result.epochs, len(model.seen)) == (5, 1, 0)


def test_end_epoch_from_epoch_start_with_a_step_budget(engine: runmodel.Engine) -> None:
    engine.on("epoch_start", lambda e: e.end_epoch(), when=lambda e: e.state.epoch == 1)
    model = Counting(batches=3)
    result = engine.run(model, steps=6)
    assert [b for b in model.seen if b[0] == 1] == []  # epoch 1 skipped, not an error
    assert result.steps == 6 and result.epochs == 3


def test_end_epoch_with_no_epoch_open_does_nothing(engine: runmodel.Engine) -> None:
    engine.on("setup", lambda e: e.end_epoch())
    result = engine.run(Counting(batches=2), epochs=2)
    assert (result.steps, result.epochs, result.ended) == (4, 2, "completed")


def test_error_notes_tell_hooks_sharing_code_apart(engine: runmodel.Engine) -> None:
    def make(fail: bool) -> Any:
        def hook(engine: runmodel.Engine) -> None:
            if fail:
                raise ValueError("from the second")

        return hook

    engine.on("epoch_start", make(False), name="quiet")
    engine.on("runstep", make(True), name="loud")
    with pytest.raises(ValueError) as info:
        engine.run(Counting(batches=1))
    note = "\n".join(info.value.__notes__)
    assert "hook 'loud'" in note  # named, even if alongside the other candidate

    class Boom(runmodel.Pack):
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def runstep(self, engine: runmodel.Engine) -> None:
            if self.fail:
                raise ValueError("this one")

    other = runmodel.Engine()
    other.attach(Boom(False), Boom(True))
    with pytest.raises(ValueError) as info:
        other.run(Counting(batches=1))
    note = "\n".join(info.value.__notes__)
    assert "hook 'Boom.runstep'" in note and " or " not in note  # self tells them apart
