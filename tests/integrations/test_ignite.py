"""``engine.ignite``: a real pytorch-ignite ``Engine`` mirroring a runmodel run. Each test
runs the same small training by ignite's own ``Engine.run`` and by runmodel, and checks
that ignite's events fire in the same order with the same state (1-based counters,
``epoch_length``, ``max_epochs``, the step's loss), however the run ends: completed,
``terminate()`` or ``terminate_epoch()`` from any event, the step budget, an error.
ignite's own handlers on the mirror are in test_ignite_handlers.py."""

from __future__ import annotations

import logging
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from ignite.engine import Engine, Events
from torch import nn

import runmodel
from runmodel.integrations.ignite import MirrorEngine, default_output

import warm as subprocess
from ignite_twin import (
    CLASSES,
    CORE,
    FEATURES,
    STEP_EVENTS,
    data,
    parts,
    recorder,
    run_ignite,
    run_runmodel,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_mirror_is_an_ignite_engine_that_runs_nothing_itself(engine: runmodel.Engine) -> None:
    mirror = engine.ignite
    assert isinstance(mirror, Engine) and isinstance(mirror, MirrorEngine)
    assert engine.ignite is mirror  # built once
    with pytest.raises(RuntimeError, match=r"engine's run\(model, \.\.\.\)"):
        mirror.run(data())
    with pytest.raises(RuntimeError, match="cannot interrupt"):
        mirror.interrupt()


def test_a_plain_run_fires_the_same_events_with_the_same_state() -> None:
    a, b = run_ignite(None, 3), run_runmodel(None, 3)
    assert a.error is None and b.error is None
    assert b.trace == a.trace
    assert b.trace[:4] == [
        ("STARTED", 0, 0, 4, 3),
        ("EPOCH_STARTED", 1, 0, 4, 3),
        ("ITERATION_STARTED", 1, 1, 4, 3),
        ("ITERATION_COMPLETED", 1, 1, 4, 3, a.trace[3][5]),
    ]
    assert b.trace[-2:] == [("EPOCH_COMPLETED", 3, 12, 4, 3), ("COMPLETED", 3, 12, 4, 3)]
    assert torch.equal(a.module.weight, b.module.weight)
    assert b.result is not None and (b.result.ended, b.result.steps, b.result.epochs) == (
        "completed",
        12,
        3,
    )
    assert b.engine.should_terminate is False and b.engine.last_event_name == Events.COMPLETED


def test_counters_are_ignites_1_based_ones_beside_runmodels_0_based() -> None:
    seen: list[tuple[Any, ...]] = []

    def hooks(engine: runmodel.Engine) -> None:
        @engine.on("runstep")
        def both(engine: runmodel.Engine) -> None:
            st, s = engine.ignite.state, engine.state
            seen.append((st.epoch, st.iteration, s.epoch, s.step, s.epoch_step))

    run_runmodel(None, 2, hooks=hooks)
    assert seen == [(e + 1, e * 4 + i + 1, e, e * 4 + i, i) for e in range(2) for i in range(4)]


def test_state_batch_and_output_at_each_step_are_the_steps() -> None:
    batches = data()
    seen: list[Any] = []

    def attach(engine: Engine, *_: Any) -> None:
        engine.add_event_handler(
            Events.ITERATION_STARTED,
            lambda e: seen.append(("start", e.state.batch, e.state.output)),
        )
        engine.add_event_handler(
            Events.ITERATION_COMPLETED,
            lambda e: seen.append(("done", e.state.batch, e.state.output)),
        )

    b = run_runmodel(attach, 1, batches=batches)
    assert [s[0] for s in seen] == ["start", "done"] * 4
    for i, batch in enumerate(batches):
        assert seen[2 * i][1] is batch and seen[2 * i][2] is None
        assert seen[2 * i + 1][1] is batch
        out = seen[2 * i + 1][2]
        assert set(out) == {"y_pred", "y", "loss", "criterion_kwargs"}
        assert out["y"] is batch[1] and not out["y_pred"].requires_grad
    assert b.engine.state.dataloader is batches and b.engine.state.epoch_length == 4


# -- terminate() and terminate_epoch() -------------------------------------------------------


def terminate_at(event: Any, **kwargs: Any) -> Any:
    def attach(engine: Engine, *_: Any) -> None:
        engine.add_event_handler(event, lambda e: e.terminate(**kwargs))

    return attach


@pytest.mark.parametrize(
    ("event", "kwargs", "steps", "epochs"),
    [
        (Events.STARTED, {}, 0, 0),
        (Events.EPOCH_STARTED(once=2), {}, 4, 1),
        (Events.ITERATION_STARTED(once=7), {}, 6, 1),  # the 7th batch is dropped
        (Events.ITERATION_COMPLETED(once=7), {}, 7, 1),
        (Events.ITERATION_COMPLETED(once=8), {}, 8, 2),  # the last step of epoch 2
        (Events.EPOCH_COMPLETED(once=2), {}, 8, 2),
        (Events.ITERATION_COMPLETED(once=7), {"skip_completed": True}, 7, 1),
    ],
    ids=[
        "STARTED",
        "EPOCH_STARTED",
        "ITERATION_STARTED",
        "ITERATION_COMPLETED",
        "ITERATION_COMPLETED-last-of-epoch",
        "EPOCH_COMPLETED",
        "skip_completed",
    ],
)
def test_terminate_ends_the_run_where_ignite_ends_its_own(
    event: Any, kwargs: dict[str, Any], steps: int, epochs: int
) -> None:
    a, b = (
        run_ignite(terminate_at(event, **kwargs), 3),
        run_runmodel(terminate_at(event, **kwargs), 3),
    )
    assert a.error is None and b.error is None
    assert b.trace == a.trace
    assert ("TERMINATE", *a.trace[-1][1:]) in b.trace
    assert b.engine.should_terminate == a.engine.should_terminate
    assert b.result is not None
    assert (b.result.ended, b.result.steps, b.result.epochs) == ("stopped", steps, epochs)
    assert b.result.reason == "ignite: terminate()"
    assert torch.equal(a.module.weight, b.module.weight)


def test_terminate_from_outside_ignites_events_stops_at_the_next_event() -> None:
    """ignite's process function calling terminate() at iteration 6 ends the run after
    ITERATION_COMPLETED; so does a runmodel hook calling it at that step (after the mirror's
    own hook): the next batch is dropped before ITERATION_STARTED, and no epoch starts."""
    a = run_ignite(terminate_at(Events.ITERATION_COMPLETED(once=6)), 3)
    b = run_runmodel(
        None,
        3,
        hooks=lambda engine: engine.on(
            "runstep", lambda engine: engine.ignite.terminate(), when=lambda e: e.state.step == 5
        ),
    )
    assert b.trace == a.trace
    assert b.result is not None and (b.result.ended, b.result.steps, b.result.skipped) == (
        "stopped",
        6,
        1,
    )
    # at an epoch's end (a runmodel epoch_end hook, as a handler of another engine would):
    # no EPOCH_STARTED follows
    a = run_ignite(terminate_at(Events.EPOCH_COMPLETED(once=1)), 3)
    b = run_runmodel(
        None,
        3,
        hooks=lambda engine: engine.on(
            "epoch_end", lambda engine: engine.ignite.terminate(), once=0
        ),
    )
    assert b.trace == a.trace
    assert b.result is not None and (b.result.steps, b.result.epochs) == (4, 1)


def terminate_epoch_at(event: Any, skip: bool = False) -> Any:
    def attach(engine: Engine, *_: Any) -> None:
        engine.add_event_handler(event, lambda e: e.terminate_epoch(skip_epoch_completed=skip))

    return attach


@pytest.mark.parametrize(
    ("event", "skip", "steps"),
    [
        (Events.ITERATION_COMPLETED(once=6), False, 10),
        (Events.ITERATION_COMPLETED(once=6), True, 10),
        (Events.ITERATION_STARTED(once=3), False, 10),  # the 3rd batch is dropped
        # ignite's once=3 reads state.iteration, which a batch dropped before ITERATION_STARTED
        # does not advance: it fires again in each later epoch, which then ends at once
        (Events.GET_BATCH_COMPLETED(once=3), False, 3),
        (Events.GET_BATCH_STARTED(once=3), False, 3),
    ],
    ids=[
        "ITERATION_COMPLETED",
        "skip_epoch_completed",
        "ITERATION_STARTED",
        "GET_BATCH_COMPLETED",
        "GET_BATCH_STARTED",
    ],
)
def test_terminate_epoch_ends_the_epoch_as_in_ignite(event: Any, skip: bool, steps: int) -> None:
    a = run_ignite(terminate_epoch_at(event, skip), 3, events=CORE)
    b = run_runmodel(terminate_epoch_at(event, skip), 3, events=CORE)
    assert b.trace == a.trace
    assert any(row[0] == "TERMINATE_SINGLE_EPOCH" for row in b.trace)  # with iter_counter=
    assert b.result is not None and (b.result.ended, b.result.steps, b.result.epochs) == (
        "completed",
        steps,
        3,
    )
    assert torch.equal(a.module.weight, b.module.weight)


def test_terminate_epoch_at_epoch_started_is_an_error_in_both() -> None:
    a = run_ignite(terminate_epoch_at(Events.EPOCH_STARTED(once=2)), 3)
    b = run_runmodel(terminate_epoch_at(Events.EPOCH_STARTED(once=2)), 3)
    assert type(a.error) is type(b.error) is RuntimeError
    assert "terminate_epoch()" in str(a.error) and "terminate_epoch()" in str(b.error)
    assert b.trace == a.trace


def test_runmodels_stop_ends_the_mirror_as_terminate_would() -> None:
    a = run_ignite(terminate_at(Events.ITERATION_COMPLETED(once=7)), 3)
    b = run_runmodel(
        None,
        3,
        hooks=lambda engine: engine.on(
            "runstep", lambda engine: engine.stop("enough"), when=lambda e: e.state.step == 6
        ),
    )
    assert b.trace == a.trace
    assert b.engine.should_terminate is True  # set by the mirror, as max_iters does in ignite


# -- filters, the budget -------------------------------------------------------------------


def test_ignites_event_filters_work_on_the_mirror() -> None:
    def attach(engine: Engine, *_: Any) -> list[Any]:
        hits: list[Any] = []

        def hit(label: str) -> Any:
            return lambda e: hits.append((label, e.state.epoch, e.state.iteration))

        engine.add_event_handler(Events.ITERATION_COMPLETED(every=3), hit("every3"))
        engine.add_event_handler(Events.ITERATION_STARTED(once=7), hit("once7"))
        engine.add_event_handler(Events.ITERATION_COMPLETED(once=[2, 9]), hit("once2,9"))
        engine.add_event_handler(Events.EPOCH_COMPLETED(every=2), hit("epoch-every2"))
        engine.add_event_handler(Events.ITERATION_COMPLETED(before=4, after=1), hit("1<i<4"))
        engine.add_event_handler(
            Events.ITERATION_COMPLETED(event_filter=lambda engine, i: i % 5 == 1), hit("i%5==1")
        )
        engine.add_event_handler(
            Events.EPOCH_STARTED | Events.COMPLETED,
            lambda e: hits.append((e.last_event_name.name, e.state.epoch)),
        )
        return hits

    a, b = run_ignite(attach, 3), run_runmodel(attach, 3)
    assert b.extra == a.extra
    assert ("every3", 3, 12) in b.extra and ("once7", 2, 7) in b.extra
    assert ("i%5==1", 3, 11) in b.extra and ("COMPLETED", 3) in b.extra


def test_handlers_added_and_removed_during_the_run_take_effect_as_in_ignite() -> None:
    """The mirror skips ignite's fire for step events nobody handles; a handler added by
    another (or removed through its handle, as Metric.detach does) counts from then on."""

    def attach(engine: Engine, *_: Any) -> list[Any]:
        hits: list[Any] = []
        handles: list[Any] = []

        def add(e: Engine) -> None:
            handles.append(
                e.add_event_handler(
                    Events.ITERATION_STARTED, lambda e: hits.append(("started", e.state.iteration))
                )
            )
            handles.append(
                e.add_event_handler(
                    Events.ITERATION_COMPLETED,
                    lambda e: hits.append(("completed", e.state.iteration)),
                )
            )

        engine.add_event_handler(Events.EPOCH_COMPLETED(once=1), add)
        engine.add_event_handler(
            Events.ITERATION_COMPLETED(once=6), lambda e: handles.pop().remove()
        )
        engine.add_event_handler(Events.EPOCH_COMPLETED(once=2), lambda e: handles.pop().remove())
        return hits

    a, b = run_ignite(attach, 3, events=()), run_runmodel(attach, 3, events=())
    assert b.extra == a.extra
    assert b.extra == [
        ("started", 5),
        ("completed", 5),
        ("started", 6),
        ("completed", 6),
        ("started", 7),
        ("started", 8),
    ]


@pytest.mark.parametrize("steps", [6, 8], ids=["mid-epoch", "epoch-boundary"])
def test_the_step_budget_ends_the_run_as_ignites_max_iters(steps: int) -> None:
    a, b = run_ignite(None, None, max_iters=steps), run_runmodel(None, None, steps=steps)
    assert b.trace == a.trace
    assert b.trace[0] == ("STARTED", 0, 0, 4, None)
    assert (b.trace[-2][0] == "TERMINATE") is (steps % 4 != 0)  # TERMINATE only when cut
    assert b.engine.state.max_iters == a.engine.state.max_iters == steps
    assert b.result is not None and (b.result.ended, b.result.steps) == ("budget", steps)


# -- errors ------------------------------------------------------------------------------


def raise_at(event: Any, handled: bool, errors: list[Any]) -> Any:
    def attach(engine: Engine, *_: Any) -> None:
        def boom(e: Engine) -> None:
            raise ValueError("boom")

        engine.add_event_handler(event, boom)
        if handled:
            engine.add_event_handler(
                Events.EXCEPTION_RAISED,
                lambda e, error: errors.append((type(error).__name__, e.state.iteration)),
            )

    return attach


def test_an_error_without_exception_raised_handlers_ends_both_runs_alike() -> None:
    attach = raise_at(Events.ITERATION_COMPLETED(once=6), False, [])
    a, b = run_ignite(attach, 3), run_runmodel(attach, 3)
    assert type(a.error) is type(b.error) is ValueError
    assert b.trace == a.trace
    assert b.trace[-1][:3] == ("ITERATION_COMPLETED", 2, 6)  # no COMPLETED after an error
    assert b.runmodel is not None and b.runmodel.state.ended == "failed"


def test_exception_raised_fires_but_runmodel_raises_the_error_again() -> None:
    """The one difference by design: ignite swallows an error once an EXCEPTION_RAISED
    handler ran (and goes on with the epoch); runmodel runs those handlers, then raises
    the error again, so a run never ends "completed" after a failure."""
    seen_a: list[Any] = []
    seen_b: list[Any] = []
    a = run_ignite(raise_at(Events.ITERATION_COMPLETED(once=6), True, seen_a), 3)
    b = run_runmodel(raise_at(Events.ITERATION_COMPLETED(once=6), True, seen_b), 3)
    assert seen_a == seen_b == [("ValueError", 6)]
    assert a.error is None and a.trace[-1][0] == "COMPLETED"  # ignite went on
    assert isinstance(b.error, ValueError)
    assert b.trace == a.trace[: len(b.trace)] and b.trace[-1][:3] == ("ITERATION_COMPLETED", 2, 6)
    assert b.engine.last_event_name == Events.EXCEPTION_RAISED


def test_an_error_in_the_models_step_reaches_exception_raised() -> None:
    errors: list[BaseException] = []

    class Failing(runmodel.TorchModel):
        def compute_output(self, batch: Any) -> Any:
            if self.calls == 2:
                raise OverflowError("step 3")
            self.calls += 1
            return self.module(batch[0])  # type: ignore[misc]

    module, optimizer, loss_fn = parts()
    model = Failing.from_parts(module, optimizer=optimizer, loss_fn=loss_fn, train_data=data())
    model.calls = 0
    engine = runmodel.Engine()
    engine.ignite.add_event_handler(Events.EXCEPTION_RAISED, lambda e, error: errors.append(error))
    with pytest.raises(OverflowError, match="step 3"):
        engine.run(model, epochs=1)
    assert len(errors) == 1 and isinstance(errors[0], OverflowError)
    assert engine.ignite.state.iteration == 3


# -- what state.output holds ---------------------------------------------------------------


def test_output_at_epoch_completed_and_after_the_run_is_the_last_steps() -> None:
    """With no ITERATION_COMPLETED handler the mirror makes no output per step, yet an
    EPOCH_COMPLETED handler (the usual ``print(trainer.state.output)``) and a read after
    the run see the last step's, as on ignite's engine."""

    def attach(engine: Engine, *_: Any) -> list[float]:
        losses: list[float] = []
        engine.add_event_handler(
            Events.EPOCH_COMPLETED, lambda e: losses.append(round(float(e.state.output["loss"]), 6))
        )
        return losses

    events = [Events.STARTED]  # no recorder on ITERATION_COMPLETED
    a, b = run_ignite(attach, 3, events=events), run_runmodel(attach, 3, events=events)
    assert b.extra == a.extra and len(b.extra) == 3
    assert torch.equal(b.engine.state.output["loss"], a.engine.state.output["loss"])


def test_output_transform_gives_ignites_trainer_convention() -> None:
    from ignite.engine import create_supervised_trainer

    module, optimizer, loss_fn = parts()
    trainer = create_supervised_trainer(module, optimizer, loss_fn)
    losses_a: list[float] = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses_a.append(e.state.output))
    trainer.run(data(), max_epochs=2)

    losses_b: list[float] = []

    def hooks(engine: runmodel.Engine) -> None:
        engine.ignite.output_transform = lambda engine: engine.state.loss.item()  # type: ignore[attr-defined]
        engine.ignite.add_event_handler(
            Events.ITERATION_COMPLETED, lambda e: losses_b.append(e.state.output)
        )

    run_runmodel(None, 2, hooks=hooks)
    assert losses_b == losses_a and all(isinstance(x, float) for x in losses_b)


def test_default_output_of_other_models() -> None:
    class OwnStep(runmodel.Supervised):  # its own train_step: the whole step, one action
        def train_step(self, model: Any, batch: Any) -> dict[str, Any]:
            output = model.module(batch[0])
            loss = model.loss_fn(output, batch[1])
            loss.backward()
            model.optimizer.step()
            model.optimizer.zero_grad()
            return {"loss": loss.detach(), "output": output.detach()}

    class Dicts(runmodel.Model):  # not a TorchModel: its step's output as it is
        def run(self, runstep: Any, steps: Any = None, *args: Any, **kwargs: Any) -> None:
            runstep(1)

        def step(self, batch: Any) -> Any:
            return {"output": batch, "other": 2}

    module, optimizer, loss_fn = parts()
    model = runmodel.TorchModel.from_parts(
        module, optimizer=optimizer, loss_fn=loss_fn, train_data=data(1), eval_data=data(1)
    )
    model.interface = OwnStep()
    outputs: list[Any] = []
    engine = runmodel.Engine()
    engine.ignite.add_event_handler(
        Events.ITERATION_COMPLETED, lambda e: outputs.append(e.state.output)
    )
    engine.run(model, epochs=1)
    engine.run(Dicts())
    engine.run(model, "infer")
    (own, plain, infer) = outputs
    assert set(own) == {"y_pred", "y", "loss", "criterion_kwargs"}
    assert own["y_pred"].shape == (8, 3) and own["y"] is model.train_data[0][1]
    assert plain == {"output": 1, "other": 2}
    assert isinstance(infer, torch.Tensor) and infer.shape == (8, 3)
    assert default_output(engine) is infer  # the last run's: infer mode hands it over as is


# -- runs, resumes, the eval mode ----------------------------------------------------------


def test_a_resumed_run_continues_ignites_counters() -> None:
    """ignite resumed from {"epoch": 2} and runmodel resumed from counters of 2 epochs fire
    the same events from iteration 9, epoch 3 on, and equal a straight run's tail."""
    straight = run_runmodel(None, 4).trace
    trainer = Engine(lambda e, batch: None)
    trace_a: list[Any] = []
    recorder(trainer, trace_a, STEP_EVENTS)
    trainer.load_state_dict({"epoch": 2, "epoch_length": 4, "max_epochs": 4})
    trainer.run(data())

    engine = runmodel.Engine()
    engine.load_state_dict({"counters": {"step": 8, "epoch": 2}})
    b = run_runmodel(None, 4, engine=engine)
    strip = [row[:5] for row in b.trace]
    assert strip == [row[:5] for row in trace_a]
    assert strip[:3] == [
        ("STARTED", 2, 8, 4, 4),
        ("EPOCH_STARTED", 3, 8, 4, 4),
        ("ITERATION_STARTED", 3, 9, 4, 4),
    ]
    assert [row[:5] for row in straight if row[2] > 8 or row[0] == "COMPLETED"] == strip[2:]


def test_a_run_resumed_from_a_runmodel_checkpoint_continues_the_mirror(tmp_path: Path) -> None:
    def seen(engine: runmodel.Engine) -> list[Any]:
        rows: list[Any] = []
        engine.ignite.add_event_handler(
            Events.EPOCH_COMPLETED, lambda e: rows.append((e.state.epoch, e.state.iteration))
        )
        return rows

    first = runmodel.Engine()
    first.attach(runmodel.packs.Checkpoint(tmp_path))
    rows_first = seen(first)
    module, optimizer, loss_fn = parts()
    first.run(
        runmodel.TorchModel.from_parts(
            module, optimizer=optimizer, loss_fn=loss_fn, train_data=data()
        ),
        epochs=2,
    )
    second = runmodel.Engine()
    second.attach(runmodel.packs.Checkpoint(tmp_path))
    rows_second = seen(second)
    module, optimizer, loss_fn = parts()
    second.run(
        runmodel.TorchModel.from_parts(
            module, optimizer=optimizer, loss_fn=loss_fn, train_data=data()
        ),
        epochs=4,
        resume=tmp_path,
    )
    assert rows_first == [(1, 4), (2, 8)] and rows_second == [(3, 12), (4, 16)]


def test_two_runs_in_a_row_start_the_mirror_over() -> None:
    engine = runmodel.Engine()
    b1 = run_runmodel(None, 2, engine=engine)
    b2 = run_runmodel(None, 1, engine=engine)  # b1's recorder sees this run too
    a1, a2 = run_ignite(None, 2), run_ignite(None, 1)
    assert b1.trace == a1.trace + a2.trace and b2.trace == a2.trace
    assert b2.trace[0] == ("STARTED", 0, 0, 4, 1)


def test_an_iteration_started_handler_may_replace_the_batch() -> None:
    def attach(engine: Engine, *_: Any) -> None:
        def halve(e: Engine) -> None:
            x, y = e.state.batch
            e.state.batch = (x * 0.5, y)

        engine.add_event_handler(Events.ITERATION_STARTED, halve)

    a, b = run_ignite(attach, 2), run_runmodel(attach, 2)
    assert b.trace == a.trace and torch.equal(a.module.weight, b.module.weight)


def test_data_without_a_length_gets_its_epoch_length_at_the_first_epochs_end() -> None:
    class Unsized:
        def __iter__(self) -> Any:
            return iter(data())

    a, b = run_ignite(None, 2, batches=Unsized()), run_runmodel(None, 2, batches=Unsized())
    assert b.trace == a.trace
    assert b.trace[0][3] is None and b.trace[-1][3] == 4


def test_eval_mode_fires_one_epoch_and_ignite_metrics_join_the_result() -> None:
    from ignite.engine import create_supervised_evaluator
    from ignite.metrics import Accuracy

    module, _, loss_fn = parts()
    evaluator = create_supervised_evaluator(module, metrics={"acc": Accuracy()})
    trace_a: list[Any] = []
    recorder(
        evaluator,
        trace_a,
        [
            Events.STARTED,
            Events.EPOCH_STARTED,
            Events.ITERATION_COMPLETED,
            Events.EPOCH_COMPLETED,
            Events.COMPLETED,
        ],
    )
    evaluator.run(data(seed=1))
    model = runmodel.TorchModel.from_parts(module, loss_fn=loss_fn, eval_data=data(seed=1))
    engine = runmodel.Engine()
    trace_b: list[Any] = []
    recorder(
        engine.ignite,
        trace_b,
        [
            Events.STARTED,
            Events.EPOCH_STARTED,
            Events.ITERATION_COMPLETED,
            Events.EPOCH_COMPLETED,
            Events.COMPLETED,
        ],
    )
    Accuracy().attach(engine.ignite, "acc_ignite")
    result = engine.run(model, "eval")
    assert [r[:5] for r in trace_b] == [r[:5] for r in trace_a]
    assert result.metrics["acc_ignite"] == evaluator.state.metrics["acc"]
    assert result.metrics["accuracy"] == result.metrics["acc_ignite"]  # runmodel's own


# -- what an engine that never reads .ignite pays ------------------------------------------


def test_reading_ignite_adds_seven_hooks_named_ignite(engine: runmodel.Engine) -> None:
    def named_ignite() -> list[str]:
        return [
            phase
            for phase, hooks in engine.table.hooks.items()
            for hook in hooks
            if hook.name == "ignite"
        ]

    assert named_ignite() == []
    engine.ignite  # noqa: B018
    assert sorted(named_ignite()) == sorted(
        ["setup", "epoch_start", "step_start", "runstep", "epoch_end", "exception", "teardown"]
    )


def test_first_read_during_a_run_is_refused() -> None:
    """A mirror built mid-run would have missed STARTED and its counters: refused."""
    engine = runmodel.Engine()
    engine.on("epoch_start", lambda engine: engine.ignite)
    model = runmodel.TorchModel.from_parts(
        nn.Linear(FEATURES, CLASSES),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        loss_fn=nn.CrossEntropyLoss(),
        train_data=data(1),
    )
    with pytest.raises(RuntimeError, match=r"read it .* before engine\.run\(\)"):
        engine.run(model, epochs=1)
    assert isinstance(engine.ignite, Engine)  # between runs it may be read


def test_an_engine_that_never_reads_ignite_does_not_import_it() -> None:
    script = textwrap.dedent("""
        import sys
        import torch
        from torch import nn
        import runmodel
        data = [(torch.randn(4, 3), torch.zeros(4, dtype=torch.long))] * 3
        model = runmodel.TorchModel.from_parts(
            nn.Linear(3, 2), optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
            loss_fn=nn.CrossEntropyLoss(), train_data=data)
        engine = runmodel.Engine()
        result = engine.run(model, "train", epochs=2)
        assert result.steps == 6, result
        names = [hook.name for hooks in engine.table.hooks.values() for hook in hooks]
        assert "ignite" not in names, names
        print(sorted(m for m in sys.modules if m == "ignite" or m.startswith("ignite.")))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- ignite's own log lines ------------------------------------------------------------------


class Lines(logging.Handler):
    """The messages ignite's Engine logger gives (as ``LEVEL message``, its times as
    ``T``), at ``level`` and up."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = re.sub(r"\d\d:\d\d:\d\d\.\d\d\d", "T", record.getMessage())
        self.lines.append(f"{record.levelname} {text}")


def logged(run: Callable[[], Any], level: int) -> list[str]:
    """What ``run()`` logs through ignite's ``Engine`` logger, as an ignite program's
    ``logging.basicConfig(level=level)`` shows it."""
    logger = logging.getLogger("ignite.engine.engine.Engine")
    handler, old_level = Lines(level), logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        run()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return handler.lines


@pytest.mark.parametrize(
    ("attach", "level"),
    [
        (None, logging.DEBUG),  # and every event fired, handled or not
        (None, logging.INFO),
        (terminate_at(Events.ITERATION_COMPLETED(once=6)), logging.INFO),
        (terminate_at(Events.EPOCH_COMPLETED(once=2)), logging.INFO),
        (terminate_epoch_at(Events.ITERATION_COMPLETED(once=6), True), logging.INFO),
        (raise_at(Events.ITERATION_COMPLETED(once=6), False, []), logging.INFO),
        (raise_at(Events.EPOCH_COMPLETED(once=1), False, []), logging.INFO),
    ],
    ids=[
        "debug",
        "info",
        "terminate",
        "terminate-at-epoch",
        "terminate_epoch",
        "error",
        "error-at-epoch",
    ],
)
def test_the_mirror_logs_ignites_engine_lines(attach: Any, level: int) -> None:
    """The lines an ignite program shows from its trainer's logger (the run's start, each
    epoch's end, the run's end, an error; at DEBUG each event fired) are the mirror's."""
    a = logged(lambda: run_ignite(attach, 3, events=CORE), level)
    b = logged(lambda: run_runmodel(attach, 3, events=CORE), level)
    # the one event the mirror never fires: its data is the model's, not an iterator of
    # ignite's that runs dry at each epoch's first GET_BATCH_STARTED
    assert b == [line for line in a if "DATALOADER_STOP_ITERATION" not in line]
    assert any("Engine run" in line for line in a)
    if attach is None and level == logging.INFO:
        assert a == [
            "INFO Engine run starting with max_epochs=3.",
            "INFO Epoch[1] Complete. Time taken: T",
            "INFO Epoch[2] Complete. Time taken: T",
            "INFO Epoch[3] Complete. Time taken: T",
            "INFO Engine run finished. Time taken: T",
        ]


def test_the_mirror_logs_a_resume_as_ignite_does() -> None:
    def ignite_resumed() -> None:
        trainer = Engine(lambda e, batch: None)
        trainer.load_state_dict({"epoch": 2, "epoch_length": 4, "max_epochs": 4})
        trainer.run(data())

    def runmodel_resumed() -> None:
        engine = runmodel.Engine()
        engine.load_state_dict({"counters": {"step": 8, "epoch": 2}})
        run_runmodel(None, 4, engine=engine)

    a, b = logged(ignite_resumed, logging.INFO), logged(runmodel_resumed, logging.INFO)
    assert b == a
    assert a[0] == "INFO Engine run resuming from iteration 8, epoch 2 until 4 epochs"
    # a step budget is ignite's max_iters
    a = logged(lambda: run_ignite(None, None, max_iters=6), logging.INFO)
    b = logged(lambda: run_runmodel(None, None, steps=6), logging.INFO)
    assert b == a and a[0] == "INFO Engine run starting with max_iters=6."


def test_the_mirrors_logger_is_ignites_engines(engine: runmodel.Engine) -> None:
    assert engine.ignite.logger is logging.getLogger("ignite.engine.engine.Engine")
