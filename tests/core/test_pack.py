"""Packs: methods named after phases, options, overrides, nesting, detach, state."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import runmodel

from helpers import Counting


class Recorder(runmodel.Pack):
    """Counts epochs and steps; its counts are its state."""

    def __init__(self, log: list[str], tag: str = "rec") -> None:
        self.log, self.tag = log, tag
        self.steps = 0

    def epoch_start(self, engine: runmodel.Engine) -> None:
        self.log.append(f"{self.tag}:epoch_start")

    def runstep(self, engine: runmodel.Engine) -> None:
        self.steps += 1

    @runmodel.hook("epoch_end", priority=5, every=2)
    def every_other_epoch(self, engine: runmodel.Engine) -> None:
        self.log.append(f"{self.tag}:epoch_end@{engine.state.epoch}")

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]


class Doubler(runmodel.Pack):
    """An override inside a pack: runs the step action twice."""

    name = "double"

    def __init__(self, log: list[str]) -> None:
        self.log = log

    @runmodel.override("runstep")
    def twice(self, engine: runmodel.Engine, default: Any) -> None:
        self.log.append("twice>")
        default(engine)
        default(engine)


class Outer(runmodel.Pack):
    def __init__(self, log: list[str]) -> None:
        self.inner = Recorder(log, tag="inner")
        self.more = [Doubler(log)]
        self.log = log

    def setup(self, engine: runmodel.Engine) -> None:
        self.log.append("outer:setup")


def test_methods_named_after_phases_are_hooks(engine: runmodel.Engine) -> None:
    log: list[str] = []
    pack = Recorder(log)
    engine.attach(pack)
    engine.run(Counting(batches=3), epochs=4)
    assert log == [
        "rec:epoch_start",
        "rec:epoch_start",
        "rec:epoch_end@1",
        "rec:epoch_start",
        "rec:epoch_start",
        "rec:epoch_end@3",
    ]
    assert pack.steps == 12
    table = engine.describe()
    assert "Recorder.every_other_epoch" in table and "every=2" in table
    assert "Recorder.runstep" in table and "state_dict" not in table


def test_nested_packs_attach_and_detach_as_one(engine: runmodel.Engine) -> None:
    log: list[str] = []
    outer = Outer(log)
    handle = engine.attach(outer)
    model = Counting(batches=2)
    engine.run(model, epochs=1)
    assert log == ["outer:setup", "inner:epoch_start", "twice>", "twice>"]
    assert model.seen == [(0, 0), (0, 0), (0, 1), (0, 1)]  # the override ran the step twice
    assert outer.inner.steps == 2
    assert set(engine.state_dict()["packs"]) == {"Outer", "Outer/Recorder", "Outer/double"}
    table = engine.describe()
    assert "Outer/Recorder" in table and "override double.twice" in table

    handle.detach()
    assert not handle.attached
    log.clear()
    model = Counting(batches=2)
    engine.run(model, epochs=1)
    assert log == [] and model.seen == [(0, 0), (0, 1)]
    assert engine.state_dict()["packs"] == {}
    assert "Outer" not in engine.describe()


def test_pack_state_round_trip() -> None:
    first = runmodel.Engine()
    pack = Recorder([])
    first.attach(pack)
    first.run(Counting(batches=3), epochs=2)
    saved = first.state_dict()
    run = saved.pop("run")  # which run, and the length it was started with
    assert run == {**first.run_record, "max_epochs": 2, "max_steps": None}
    assert saved == {
        "counters": {"step": 6, "epoch": 2, "epoch_step": 3, "skipped": 0},
        "loss": None,
        "metrics": {},
        "packs": {"Recorder": {"steps": 6}},
    }

    second = runmodel.Engine()
    restored = Recorder([])
    second.attach(restored)
    second.load_state_dict(saved)
    assert restored.steps == 6
    second.run(Counting(batches=3), epochs=3)
    assert restored.steps == 9 and second.state.step == 9


def test_saved_state_without_a_pack_warns(engine: runmodel.Engine) -> None:
    with pytest.warns(UserWarning, match="'Gone' has no attached pack"):
        engine.load_state_dict({"packs": {"Gone": {"steps": 3}}})
    with warnings.catch_warnings():  # a pack without state (a run folder's) loses nothing
        warnings.simplefilter("error")
        engine.load_state_dict({"packs": {"Gone": {}}})


def test_two_packs_of_one_class_get_distinct_keys(engine: runmodel.Engine) -> None:
    engine.attach(Recorder([]), Recorder([]))
    assert list(engine.state_dict()["packs"]) == ["Recorder", "Recorder#2"]


def test_attaching_an_instance_twice_is_an_error(engine: runmodel.Engine) -> None:
    pack = Recorder([])
    engine.attach(pack)
    with pytest.raises(ValueError, match="attached already"):
        engine.attach(pack)


def test_attach_rejects_what_is_not_a_pack(engine: runmodel.Engine) -> None:
    with pytest.raises(TypeError, match=r"engine\.on"):
        engine.attach(lambda e: None)  # type: ignore[arg-type]


def test_pack_hooks_order_with_plain_hooks(engine: runmodel.Engine) -> None:
    log: list[str] = []

    class First(runmodel.Pack):
        @runmodel.hook("epoch_start", before="late", name="first")
        def go(self, engine: runmodel.Engine) -> None:
            log.append("pack")

    engine.on("epoch_start", lambda e: log.append("plain"), name="late", priority=100)
    engine.attach(First())
    engine.run(Counting(batches=1))
    assert log == ["pack", "plain"]


def test_one_method_on_two_phases(engine: runmodel.Engine) -> None:
    log: list[str] = []

    class Both(runmodel.Pack):
        @runmodel.hook("epoch_start")
        @runmodel.hook("epoch_end")
        def mark(self, engine: runmodel.Engine) -> None:
            log.append("mark")

    engine.attach(Both())
    engine.run(Counting(batches=1), epochs=2)
    assert log == ["mark"] * 4


def test_bad_pack_method_options_fail_at_class_definition() -> None:
    with pytest.raises(ValueError, match="Did you mean 'epoch_end'"):

        class Typo(runmodel.Pack):
            @runmodel.hook("epoch_ned")
            def log(self, engine: runmodel.Engine) -> None: ...

    with pytest.raises(ValueError, match="every= and once= exclude each other"):

        class Both(runmodel.Pack):
            @runmodel.hook(every=2, once=True)
            def epoch_end(self, engine: runmodel.Engine) -> None: ...

    with pytest.raises(TypeError, match=r"called as fn\(self, engine, default\)"):

        class NoDefault(runmodel.Pack):
            @runmodel.override("backward")
            def scaled(self, engine: runmodel.Engine) -> None: ...

    with pytest.raises(ValueError, match="has no action to override"):

        class NoAction(runmodel.Pack):
            @runmodel.override("epoch_end")
            def wrap(self, engine: runmodel.Engine, default: Any) -> None: ...


def test_undecorated_phase_method_with_wrong_signature_fails_at_attach(
    engine: runmodel.Engine,
) -> None:
    class Wrong(runmodel.Pack):
        def runstep(self) -> None: ...

    with pytest.raises(TypeError, match=r"called as fn\(engine\)"):
        engine.attach(Wrong())
    assert engine.describe().count("Wrong") == 0


def test_a_subclass_sets_the_options_of_an_inherited_hook(engine: runmodel.Engine) -> None:
    log: list[str] = []

    class Base(runmodel.Pack):
        def epoch_end(self, engine: runmodel.Engine) -> None:
            log.append(f"end{engine.state.epoch}")

    class Child(Base):
        @runmodel.hook(every=2, priority=5)
        def epoch_end(self, engine: runmodel.Engine) -> None:
            super().epoch_end(engine)

    engine.attach(Child())
    engine.run(Counting(batches=1), epochs=4)
    assert log == ["end1", "end3"]
    assert "every=2" in engine.describe()


# -- check_setup: the run's setup-time checks ---------------------------------------------------


class Refuses(runmodel.Pack):
    """Refuses every run in ``check_setup``; records what else of it runs."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def check_setup(self, engine: runmodel.Engine) -> None:
        self.log.append(f"check@{engine.state.step}")
        raise ValueError("this run cannot work: do this instead")

    def setup(self, engine: runmodel.Engine) -> None:
        self.log.append("setup")

    def exception(self, engine: runmodel.Engine) -> None:
        self.log.append("exception")

    def teardown(self, engine: runmodel.Engine) -> None:
        self.log.append("teardown")


def test_a_refusing_check_ends_the_run_before_any_hook(engine: runmodel.Engine) -> None:
    log: list[str] = []
    engine.on("teardown", lambda e: log.append("plain teardown"))
    engine.on("exception", lambda e: log.append("plain exception"))
    engine.attach(Refuses(log))
    model = Counting()
    with pytest.raises(ValueError, match="cannot work: do this instead") as info:
        engine.run(model, epochs=1)
    assert log == ["check@0"]  # no setup, exception or teardown hook ran
    assert model.calls == ["model.setup", "model.teardown"]
    assert info.value.__cause__ is None and info.value.__context__ is None


def test_checks_run_in_attach_order_after_model_setup_and_the_run_goes_on(
    engine: runmodel.Engine,
) -> None:
    log: list[str] = []

    class Checks(runmodel.Pack):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def check_setup(self, engine: runmodel.Engine) -> None:
            log.append(f"{self.tag}:check")

        def setup(self, engine: runmodel.Engine) -> None:
            log.append(f"{self.tag}:setup")

    engine.attach(Checks("a"), Checks("b"))
    result = engine.run(Counting(batches=2), epochs=1)
    assert result.steps == 2
    assert log == ["a:check", "b:check", "a:setup", "b:setup"]
