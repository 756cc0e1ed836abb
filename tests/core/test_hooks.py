"""Hooks: order, filters, registration errors, handles and overrides, driven by real runs."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runmodel
import runmodel.core.filters
from runmodel.core.phases import MODES, PHASES

from helpers import Tiny

ACTION_PHASES = [p for p, spec in PHASES.items() if spec.has_action]


# -- small models and helpers ------------------------------------------------------------


class Loop(runmodel.Model):
    """``epochs`` x ``batches`` steps; each step logs ``"action"`` and may call ``on_step``."""

    def __init__(
        self,
        batches: int = 4,
        log: list[Any] | None = None,
        on_step: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__()
        self.batches = batches
        self.log: list[Any] = [] if log is None else log
        self.on_step = on_step
        self.returned: list[Any] = []

    def step(self, batch: Any) -> Any:
        self.log.append("action")
        if self.on_step is not None:
            self.on_step()
        return ("out", batch)

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        for epoch in runstep.epochs():
            for b in range(self.batches):
                self.returned.append(runstep((epoch, b)))


def recorder(log: list[Any], label: Any) -> Callable[[runmodel.Engine], None]:
    def hook(engine: runmodel.Engine) -> None:
        log.append(label)

    return hook


def step_recorder(log: list[Any]) -> Callable[[runmodel.Engine], None]:
    def hook(engine: runmodel.Engine) -> None:
        log.append(engine.state.step)

    return hook


def epoch_recorder(log: list[Any]) -> Callable[[runmodel.Engine], None]:
    def hook(engine: runmodel.Engine) -> None:
        log.append(engine.state.epoch)

    return hook


def at_recorder(log: list[Any]) -> Callable[[runmodel.Engine], None]:
    def hook(engine: runmodel.Engine) -> None:
        log.append((engine.state.epoch, engine.state.step))

    return hook


def rows(engine: runmodel.Engine, phase: str) -> list[list[str]]:
    """The describe() rows of ``phase``'s hooks and overrides (not its action row)."""
    found = []
    for line in engine.describe().splitlines()[2:]:
        cells = re.split(r"\s{2,}", line)
        if cells[0] == phase and re.fullmatch(r"o?\d+", cells[1]):
            found.append(cells)
    return found


def described_hooks(engine: runmodel.Engine, phase: str = "runstep") -> list[str]:
    return [c[2] for c in rows(engine, phase) if c[1].isdigit()]


def described_overrides(engine: runmodel.Engine, phase: str = "runstep") -> list[str]:
    return [c[2].removeprefix("override ") for c in rows(engine, phase) if c[1][0] == "o"]


def register(
    engine: runmodel.Engine, log: list[str], name: str, phase: str = "runstep", **options: Any
) -> runmodel.HookHandle:
    return engine.on(phase, recorder(log, name), name=name, **options)


def one_step(engine: runmodel.Engine) -> None:
    engine.run(Loop(batches=1), steps=1)


def cycle_names(message: str) -> list[str]:
    chain = re.search(r"has a cycle: ((?:'[^']+'(?: -> )?)+)", message)
    assert chain is not None, message
    return re.findall(r"'([^']+)'", chain.group(1))


def is_rotation(chain: list[str], cycle: list[str]) -> bool:
    """``chain`` (first name repeated last) walks ``cycle`` from some starting point."""
    if chain[0] != chain[-1] or len(chain) != len(cycle) + 1:
        return False
    start = cycle.index(chain[0]) if chain[0] in cycle else -1
    return start >= 0 and chain[:-1] == cycle[start:] + cycle[:start]


@pytest.fixture
def engine() -> runmodel.Engine:
    return runmodel.Engine()


# -- 1. ordering --------------------------------------------------------------------------


def test_higher_priority_runs_first(engine: runmodel.Engine) -> None:
    log: list[str] = []
    for name, priority in [("zero", 0), ("five", 5), ("minus", -1), ("half", 2.5)]:
        register(engine, log, name, priority=priority)
    one_step(engine)
    assert log == ["five", "half", "zero", "minus"]
    assert described_hooks(engine) == log


def test_ties_keep_registration_order(engine: runmodel.Engine) -> None:
    log: list[str] = []
    for name, priority in [("a", 0), ("b", 1), ("c", 0), ("d", 1), ("e", 0), ("f", 0)]:
        register(engine, log, name, priority=priority)
    engine.run(Loop(batches=2), steps=2)
    assert log == ["b", "d", "a", "c", "e", "f"] * 2


def test_before_and_after_win_over_priority(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "high", priority=10)
    register(engine, log, "low", priority=-10, before="high")
    register(engine, log, "mid", priority=5, after="low")
    register(engine, log, "plain", priority=7)
    one_step(engine)
    # low must precede high and mid; plain (7) is free and beats low (-10).
    assert log == ["plain", "low", "high", "mid"]
    assert described_hooks(engine) == log


def test_after_pulls_a_high_priority_hook_down(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "first", priority=100, after="second")
    register(engine, log, "second", priority=0)
    register(engine, log, "third", priority=0)
    one_step(engine)
    assert log == ["second", "first", "third"]


def test_constraint_waits_for_a_hook_registered_later(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "a", priority=5, after="late")
    register(engine, log, "b", priority=1)
    one_step(engine)
    assert log == ["a", "b"]  # "late" is absent: a is ordered by its priority alone
    assert described_hooks(engine) == ["a", "b"]

    log.clear()
    register(engine, log, "late", priority=-5)
    assert described_hooks(engine) == ["b", "late", "a"]
    one_step(engine)
    assert log == ["b", "late", "a"]


def test_pending_before_applies_on_arrival(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "x", priority=0, before="y")
    register(engine, log, "y", priority=50)
    register(engine, log, "z", priority=20)
    one_step(engine)
    assert log == ["z", "x", "y"]


def test_lists_in_before_and_after(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "p", priority=9)
    register(engine, log, "q", priority=8)
    register(engine, log, "r", priority=7)
    register(engine, log, "early", priority=-1, before=["p", "q"])
    register(engine, log, "late", priority=99, after=("q", "r"))
    one_step(engine)
    # r (7) is free of constraints and beats early (-1); late waits for both q and r
    assert log == ["r", "early", "p", "q", "late"]
    assert described_hooks(engine) == log


def test_constraints_only_act_within_their_phase(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "a", phase="step_start", priority=1)
    register(engine, log, "b", phase="runstep", priority=0, before="a")
    register(engine, log, "a", phase="runstep", priority=5)
    register(engine, log, "c", phase="step_start", priority=0, before="a")
    one_step(engine)
    assert log == ["c", "a", "b", "a"]


def test_a_name_constrains_every_hook_with_that_name(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "dup", priority=3)
    register(engine, log, "other", priority=2)
    engine.on("runstep", recorder(log, "dup2"), name="dup", priority=1)
    register(engine, log, "last", priority=0, before="dup")
    one_step(engine)
    # "last" must precede both hooks named "dup"; "other" (2) is free and beats it (0)
    assert log == ["other", "last", "dup", "dup2"]


def test_module_level_function_is_named_by_its_name(engine: runmodel.Engine) -> None:
    log: list[str] = []
    engine.on("runstep", _named_hook)
    register(engine, log, "before_it", priority=-1, before="_named_hook")
    engine.run(Loop(batches=1), steps=1)
    assert described_hooks(engine) == ["before_it", "_named_hook"]


def _named_hook(engine: runmodel.Engine) -> None:
    pass


def test_two_cycle_error_text_and_rollback(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "a", before="b")
    register(engine, log, "c", priority=-1)
    before = engine.describe()
    with pytest.raises(runmodel.HookOrderError, match=re.escape("'a' -> 'b' -> 'a'")) as info:
        register(engine, log, "b", before="a")
    message = str(info.value)
    assert "phase 'runstep'" in message
    assert "before=/after=" in message
    assert isinstance(info.value, ValueError)
    # rolled back: nothing of "b" is left, the others still run in their order
    assert engine.describe() == before
    assert described_hooks(engine) == ["a", "c"]
    one_step(engine)
    assert log == ["a", "c"]
    # the engine stays usable: "b" without the bad constraint lands after "a"
    log.clear()
    register(engine, log, "b", priority=10)
    one_step(engine)
    assert log == ["a", "b", "c"]


@pytest.mark.parametrize("length", [1, 2, 3, 4])
def test_cycle_error_shows_the_whole_chain(engine: runmodel.Engine, length: int) -> None:
    log: list[str] = []
    chain = [f"h{i}" for i in range(length)]
    for i, name in enumerate(chain):
        register(engine, log, name, before=chain[i + 1] if i + 1 < length else None)
    register(engine, log, "bystander", priority=3)
    with pytest.raises(runmodel.HookOrderError) as info:
        register(engine, log, "closer", after=chain[-1], before=chain[0])
    assert is_rotation(cycle_names(str(info.value)), [*chain, "closer"]), str(info.value)
    assert described_hooks(engine) == ["bystander", *chain]
    one_step(engine)
    assert log == ["bystander", *chain]


def test_self_cycle(engine: runmodel.Engine) -> None:
    with pytest.raises(runmodel.HookOrderError, match=re.escape("'me' -> 'me'")):
        engine.on("runstep", lambda e: None, name="me", before="me")
    assert described_hooks(engine) == []


def test_cycle_in_decorator_form_rolls_back(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "a", after="b")
    decorate = engine.on("runstep", name="b", after="a")
    with pytest.raises(runmodel.HookOrderError, match=re.escape("'a' -> 'b' -> 'a'")):
        decorate(recorder(log, "b"))
    assert described_hooks(engine) == ["a"]
    one_step(engine)
    assert log == ["a"]


def test_detach_reresolves_and_a_constraint_waits_again(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "a", priority=5, after="b")
    b = register(engine, log, "b", priority=0)
    register(engine, log, "c", priority=1)
    assert described_hooks(engine) == ["c", "b", "a"]
    b.detach()
    assert described_hooks(engine) == ["a", "c"]
    register(engine, log, "b", priority=0)
    assert described_hooks(engine) == ["c", "b", "a"]
    one_step(engine)
    assert log == ["c", "b", "a"]


def test_describe_table(engine: runmodel.Engine) -> None:
    log: list[str] = []

    def low(engine: runmodel.Engine) -> None:
        log.append("low")

    def high(engine: runmodel.Engine) -> None:
        log.append("high")

    def gate(engine: runmodel.Engine) -> bool:
        return True

    engine.on("runstep", low, priority=-2, every=3, name="low")
    engine.on("runstep", high, priority=4, when=gate, modes="train", rank=[1, 0], name="high")
    engine.on("epoch_end", low, once="2ep", name="low")
    engine.override("runstep", lambda e, d: d(e), name="wrap", priority=1.5)

    lines = engine.describe().splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "phase",
        "#",
        "hook",
        "priority",
        "filter",
        "pack",
        "source",
    ]
    assert set(lines[1]) == {"-", " "}
    assert all(len(line) <= len(lines[1]) for line in lines)
    table = {(c[0], c[1]): c for c in (re.split(r"\s{2,}", line) for line in lines[2:])}
    assert table[("epoch_start", "-")][2] == "(no hooks)"
    assert table[("runstep", "-")][2] == "action (wrapped)"
    assert table[("forward", "-")][2] == "action"
    assert table[("runstep", "o1")][2:5] == ["override wrap", "1.5", "-"]
    assert table[("runstep", "1")][2:4] == ["high", "4"]
    assert re.fullmatch(r"when=\S*gate modes=train rank=0,1", table[("runstep", "1")][4])
    assert table[("runstep", "1")][5] == "-"
    assert table[("runstep", "2")][2:6] == ["low", "-2", "every=3", "-"]
    assert table[("epoch_end", "1")][2:6] == ["low", "0", "once=2ep", "-"]
    source = table[("runstep", "2")][6]
    assert source.endswith(f"test_hooks.py:{low.__code__.co_firstlineno}")
    assert table[("runstep", "1")][6].endswith(f"test_hooks.py:{high.__code__.co_firstlineno}")
    engine.run(Loop(batches=3), steps=3)
    assert log == ["high", "high", "high", "low"]  # epoch_end's once="2ep" never came


# -- 2. property: resolved order ----------------------------------------------------------


@st.composite
def registrations(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(2, 12))
    priorities = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    rank = draw(st.permutations(range(n)))  # constraints only point forward in it: no cycle
    position = {h: k for k, h in enumerate(rank)}
    pairs = [(a, b) for a in range(n) for b in range(n) if position[a] < position[b]]
    edges = draw(
        st.lists(st.sampled_from(pairs), unique=True, max_size=min(len(pairs), 16))
        if draw(st.booleans())
        else st.just([])
    )
    # each edge a -> b is said either by a (before=b) or by b (after=a)
    said_by_first = draw(st.lists(st.booleans(), min_size=len(edges), max_size=len(edges)))
    order = draw(st.permutations(range(n)))
    return {
        "n": n,
        "priorities": priorities,
        "edges": edges,
        "by_first": said_by_first,
        "order": order,
    }


def build(spec: dict[str, Any], log: list[str]) -> runmodel.Engine:
    before: dict[int, list[str]] = {i: [] for i in range(spec["n"])}
    after: dict[int, list[str]] = {i: [] for i in range(spec["n"])}
    for (a, b), by_first in zip(spec["edges"], spec["by_first"], strict=True):
        if by_first:
            before[a].append(f"h{b}")
        else:
            after[b].append(f"h{a}")

    def option(names: list[str]) -> str | list[str] | None:
        return None if not names else names[0] if len(names) == 1 else names

    engine = runmodel.Engine()
    for i in spec["order"]:
        engine.on(
            "runstep",
            recorder(log, f"h{i}"),
            name=f"h{i}",
            priority=spec["priorities"][i],
            before=option(before[i]),
            after=option(after[i]),
        )
    return engine


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(registrations())
def test_resolved_order_property(spec: dict[str, Any]) -> None:
    log: list[str] = []
    engine = build(spec, log)
    resolved = described_hooks(engine)
    names = [f"h{i}" for i in range(spec["n"])]
    seq = {f"h{i}": k for k, i in enumerate(spec["order"])}  # registration position
    key = {name: (-spec["priorities"][int(name[1:])], seq[name]) for name in names}

    assert sorted(resolved) == sorted(names)  # a permutation of what was registered
    where = {name: k for k, name in enumerate(resolved)}
    preds: dict[str, set[str]] = {name: set() for name in names}
    for a, b in spec["edges"]:
        assert where[f"h{a}"] < where[f"h{b}"], (a, b, resolved)
        preds[f"h{b}"].add(f"h{a}")
    if not spec["edges"]:
        assert resolved == sorted(names, key=key.__getitem__)
    # the precise rule: each next hook is, of those whose constraints are met, the one
    # with the highest priority, ties broken by registration order
    placed: set[str] = set()
    for name in resolved:
        ready = [h for h in names if h not in placed and preds[h] <= placed]
        assert name == min(ready, key=key.__getitem__), (name, ready, resolved)
        placed.add(name)

    assert described_hooks(build(spec, [])) == resolved  # deterministic
    engine.run(Loop(batches=2), steps=2)
    assert log == resolved * 2  # the run calls them in the described order


# -- 3. filters -----------------------------------------------------------------------------


def fired(
    phase: str,
    record: Callable[[list[Any]], Callable[[runmodel.Engine], None]],
    *,
    batches: int = 4,
    epochs: int = 3,
    mode: str = "train",
    **options: Any,
) -> list[Any]:
    engine, log = runmodel.Engine(), []
    engine.on(phase, record(log), **options)
    engine.run(Loop(batches=batches), mode=mode, epochs=epochs)
    return log


def test_no_filter_fires_every_event() -> None:
    assert fired("runstep", step_recorder) == list(range(12))
    assert fired("epoch_end", epoch_recorder) == [0, 1, 2]


@pytest.mark.parametrize(
    ("every", "expected"),
    [(1, list(range(12))), (5, [4, 9]), (3, [2, 5, 8, 11]), (12, [11]), (13, [])],
)
def test_every_int_counts_steps(every: int, expected: list[int]) -> None:
    assert fired("runstep", step_recorder, every=every) == expected


@pytest.mark.parametrize("every", [3, "3st", "3 steps", "3step", "3ST"])
def test_every_step_durations_on_step_phases(every: int | str) -> None:
    assert fired("runstep", step_recorder, every=every) == [2, 5, 8, 11]
    assert fired("step_start", step_recorder, every=every) == [2, 5, 8, 11]


@pytest.mark.parametrize("every", [2, "2ep", "2 epochs", "2epoch"])
def test_every_epochs_on_epoch_phases(every: int | str) -> None:
    assert fired("epoch_end", epoch_recorder, epochs=5, every=every) == [1, 3]
    assert fired("epoch_start", epoch_recorder, epochs=5, every=every) == [1, 3]


def test_every_epochs_on_a_step_phase_fires_on_the_epochs_first_step() -> None:
    assert fired("runstep", at_recorder, epochs=4, every="2ep") == [(1, 4), (3, 12)]
    assert fired("step_start", at_recorder, epochs=3, every="1ep") == [(0, 0), (1, 4), (2, 8)]


def test_every_steps_on_an_epoch_phase_fires_when_the_point_is_crossed() -> None:
    # epoch_end sees 2, 4, 6, 8 completed steps: 3 is crossed at 4, 6 at 6, 9 never
    assert fired("epoch_end", at_recorder, batches=2, epochs=4, every="3st") == [(1, 4), (2, 6)]


def test_every_on_run_phases() -> None:
    assert fired("teardown", epoch_recorder, epochs=3, every="2ep") == [3]
    assert fired("teardown", epoch_recorder, epochs=1, every="2ep") == []
    assert fired("setup", epoch_recorder, every=1) == [0]


def test_once_true_fires_on_the_first_event_of_each_run() -> None:
    assert fired("runstep", at_recorder, once=True) == [(0, 0)]
    assert fired("epoch_end", at_recorder, once=True) == [(0, 4)]
    engine, log = runmodel.Engine(), []
    engine.on("runstep", step_recorder(log), once=True)
    engine.on("setup", recorder(log, "setup"), once=True)
    engine.run(Loop(batches=3), epochs=2)
    engine.run(Loop(batches=3), epochs=2)
    assert log == ["setup", 0, "setup", 0]


# positions are the run's own counters, from 0: "at epoch 2" is state.epoch == 2
@pytest.mark.parametrize(
    ("phase", "once", "expected"),
    [
        ("runstep", 0, [(0, 0)]),
        ("runstep", 3, [(0, 3)]),
        ("runstep", "6st", [(1, 6)]),
        ("runstep", "2ep", [(2, 8)]),  # the first step of epoch 2
        ("runstep", 100, []),
        ("epoch_start", 0, [(0, 0)]),
        ("epoch_end", 2, [(2, 12)]),
        ("epoch_end", "1ep", [(1, 8)]),
        ("epoch_end", "3ep", []),  # epochs 0, 1 and 2 run
        ("epoch_end", "5st", [(1, 8)]),  # the epoch in which step 5 ran
        ("epoch_end", "0st", [(0, 4)]),
        ("epoch_end", "3st", [(0, 4)]),  # an epoch's last step: that epoch's end
        ("epoch_end", "4st", [(1, 8)]),  # the next epoch's first step
        ("epoch_start", "2ep", [(2, 8)]),
    ],
)
def test_once_at_a_point(phase: str, once: int | str, expected: list[Any]) -> None:
    assert fired(phase, at_recorder, once=once) == expected


def test_once_false_is_no_filter() -> None:
    assert fired("runstep", step_recorder, once=False) == list(range(12))
    assert fired("runstep", step_recorder, every=4, once=False) == [3, 7, 11]


def test_when_gets_the_engine_and_gates_each_event() -> None:
    seen: list[Any] = []
    engine, log = runmodel.Engine(), []

    def gate(e: runmodel.Engine) -> bool:
        seen.append(e)
        return e.state.step % 3 == 0

    engine.on("runstep", step_recorder(log), when=gate)
    engine.run(Loop(batches=4), epochs=3)
    assert log == [0, 3, 6, 9]
    assert len(seen) == 12 and all(e is engine for e in seen)


def test_every_and_when_combine() -> None:
    log = fired("runstep", at_recorder, every=2, when=lambda e: e.state.epoch != 1)
    assert log == [(0, 1), (0, 3), (2, 9), (2, 11)]
    log = fired(
        "epoch_end", epoch_recorder, epochs=6, every="2ep", when=lambda e: e.state.epoch > 2
    )
    assert log == [3, 5]


@pytest.mark.parametrize(
    ("modes", "mode", "fires"),
    [
        ({"eval"}, "train", False),
        ({"eval"}, "eval", True),
        ("train", "train", True),
        ("train", "infer", False),
        (["train", "eval"], "eval", True),
        (("benchmark",), "profile", False),
        (frozenset(MODES), "infer", True),
    ],
)
def test_modes(modes: Any, mode: str, fires: bool) -> None:
    log = fired("runstep", step_recorder, epochs=1, mode=mode, modes=modes)
    assert log == ([0, 1, 2, 3] if fires else [])


def test_modes_filter_in_a_train_run_does_not_touch_other_hooks(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "eval_only", modes={"eval"})
    register(engine, log, "always")
    engine.run(Loop(batches=2), mode="train", epochs=1)
    assert log == ["always", "always"]
    log.clear()
    engine.run(Loop(batches=1), mode="eval", epochs=1)
    assert log == ["eval_only", "always"]


@pytest.mark.parametrize(
    ("env", "rank", "fires"),
    [
        ("1", 0, False),
        ("1", 1, True),
        ("1", [0, 1], True),
        ("1", (0, 2), False),
        (None, 0, True),
        (None, 1, False),
        ("3", 3, True),
    ],
)
def test_rank(monkeypatch: pytest.MonkeyPatch, env: str | None, rank: Any, fires: bool) -> None:
    if env is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", env)
    log = fired("runstep", step_recorder, epochs=1, rank=rank)
    assert log == ([0, 1, 2, 3] if fires else [])


def test_rank_is_read_at_each_run(monkeypatch: pytest.MonkeyPatch, engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "rank0", rank=0)
    monkeypatch.setenv("RANK", "1")
    engine.run(Loop(batches=1), epochs=1)
    assert log == []
    monkeypatch.setenv("RANK", "0")
    engine.run(Loop(batches=1), epochs=1)
    assert log == ["rank0"]


class FakeClock:
    """Stands in for the ``time`` module of runmodel.core.filters; steps move it forward."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 1000.0, tick

    def monotonic(self) -> float:
        return self.now

    def advance(self) -> None:
        self.now += self.tick


@pytest.mark.parametrize(
    ("every", "tick"), [("30s", 10), ("0.5min", 10), ("10min", 200), ("1h", 1200), ("30 sec", 10)]
)
def test_every_wall_clock_duration(
    monkeypatch: pytest.MonkeyPatch, every: str, tick: float
) -> None:
    clock = FakeClock(tick)
    monkeypatch.setattr(runmodel.core.filters, "time", clock)
    engine, log = runmodel.Engine(), []
    engine.on("runstep", step_recorder(log), every=every)
    engine.run(Loop(batches=4, on_step=clock.advance), epochs=3)
    # each step adds a third of the period: crossed after steps 3, 6, 9, 12
    assert log == [2, 5, 8, 11]


def test_once_wall_clock_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(25)
    monkeypatch.setattr(runmodel.core.filters, "time", clock)
    engine, log = runmodel.Engine(), []
    engine.on("runstep", step_recorder(log), once="1min")
    engine.run(Loop(batches=4, on_step=clock.advance), epochs=3)
    assert log == [2]  # 75 s after the start, the first read past 60 s


def test_long_wall_clock_periods_never_fire_in_a_short_run() -> None:
    assert fired("runstep", step_recorder, every="1h") == []
    assert fired("epoch_end", epoch_recorder, once="30min") == []


def test_hook_added_mid_run_fires_from_the_next_event(engine: runmodel.Engine) -> None:
    log: list[int] = []

    def add(e: runmodel.Engine) -> None:
        if e.state.step == 3:
            e.on("runstep", step_recorder(log), name="late")

    engine.on("runstep", add)
    engine.run(Loop(batches=4), steps=7)
    assert log == [4, 5, 6]


def test_every_hook_added_from_step_start_counts_like_a_straight_run(
    engine: runmodel.Engine,
) -> None:
    log: list[int] = []

    def add(e: runmodel.Engine) -> None:
        if e.state.step == 3:
            e.on("runstep", step_recorder(log), every=2, name="late")

    engine.on("step_start", add)
    engine.run(Loop(batches=4), epochs=3)
    assert log == [3, 5, 7, 9, 11]


def test_every_hook_added_mid_step_keeps_its_period(engine: runmodel.Engine) -> None:
    log: list[int] = []

    def add(e: runmodel.Engine) -> None:
        if e.state.step == 3:
            e.on("runstep", step_recorder(log), every=2, name="late")

    engine.on("runstep", add)
    engine.run(Loop(batches=4), epochs=3)
    assert log == [5, 7, 9, 11]


def test_every_epoch_hook_added_mid_epoch_keeps_its_period(engine: runmodel.Engine) -> None:
    log: list[int] = []

    def add(e: runmodel.Engine) -> None:
        if e.state.epoch == 1:
            e.on("epoch_start", epoch_recorder(log), every=2, name="late")

    engine.on("epoch_start", add)
    engine.run(Loop(batches=1), epochs=6)
    assert log == [3, 5]


# -- 4. registration errors --------------------------------------------------------------


def nop(engine: runmodel.Engine) -> None:
    pass


def nop_override(engine: runmodel.Engine, default: Callable[[runmodel.Engine], Any]) -> Any:
    return default(engine)


def assert_nothing_registered(engine: runmodel.Engine) -> None:
    assert all(
        not described_hooks(engine, p) and not described_overrides(engine, p) for p in PHASES
    )


def test_unknown_phase_suggests_and_lists_valid(engine: runmodel.Engine) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "unknown phase 'epch_start'. Did you mean 'epoch_start'? Valid phases: "
            + ", ".join(PHASES)
        ),
    ):
        engine.on("epch_start", nop)
    assert_nothing_registered(engine)


def test_unknown_phase_without_close_match(engine: runmodel.Engine) -> None:
    with pytest.raises(
        ValueError, match=re.escape("unknown phase 'zzzz'. Valid phases: setup, ")
    ) as info:
        engine.on("zzzz", nop)
    assert "Did you mean" not in str(info.value)


def test_non_string_phase(engine: runmodel.Engine) -> None:
    with pytest.raises(ValueError, match=r"unknown phase 3\. Valid phases"):
        engine.on(3, nop)  # type: ignore[arg-type]


def test_unknown_phase_in_decorator_form_raises_at_the_on_call(engine: runmodel.Engine) -> None:
    with pytest.raises(ValueError, match="Did you mean 'epoch_start'"):
        engine.on("epch_start")
    with pytest.raises(ValueError, match="Did you mean 'runstep'"):
        engine.override("runstp")
    assert_nothing_registered(engine)


def test_bad_options_in_decorator_form_raise_at_the_on_call(engine: runmodel.Engine) -> None:
    with pytest.raises(ValueError, match="every= must be at least 1"):
        engine.on("runstep", every=0)
    with pytest.raises(TypeError, match="priority="):
        engine.on("runstep", priority="high")
    with pytest.raises(ValueError, match="has no action to override"):
        engine.override("epoch_start")


def test_unknown_override_phase_lists_only_phases_with_actions(engine: runmodel.Engine) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape("Did you mean 'backward'? Valid phases: " + ", ".join(ACTION_PHASES)),
    ):
        engine.override("backwards", nop_override)


def test_not_callable(engine: runmodel.Engine) -> None:
    with pytest.raises(TypeError, match="a hook must be callable, got int 42"):
        engine.on("runstep", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="an override must be callable, got str 'x'"):
        engine.override("runstep", "x")  # type: ignore[arg-type]
    assert_nothing_registered(engine)


def test_hook_signature_too_few(engine: runmodel.Engine) -> None:
    def no_args() -> None:
        pass

    with pytest.raises(
        TypeError,
        match=r"a hook .*no_args has signature \(\).*, but it is "
        r"called as fn\(engine\)",
    ):
        engine.on("runstep", no_args)


def test_hook_signature_too_many(engine: runmodel.Engine) -> None:
    def two(engine: runmodel.Engine, extra: Any) -> None:
        pass

    with pytest.raises(
        TypeError,
        match=r"a hook .*two has signature \(engine.*extra.*\).*, "
        r"but it is called as fn\(engine\)",
    ):
        engine.on("runstep", two)
    assert_nothing_registered(engine)


def test_hook_signatures_that_fit(
    engine: runmodel.Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    called: list[Any] = []

    def optional(engine: runmodel.Engine, extra: int = 1) -> None:
        called.append(("optional", extra))

    def star(*args: Any) -> None:
        called.append(("star", len(args)))

    class WithCall:
        def __call__(self, engine: runmodel.Engine) -> None:
            called.append(("call", type(engine).__name__))

    for fn in (optional, star, WithCall(), print):
        engine.on("runstep", fn)
    assert len(described_hooks(engine)) == 4
    capsys.readouterr()
    one_step(engine)
    assert called == [("optional", 1), ("star", 1), ("call", "Engine")]
    assert capsys.readouterr().out.count("\n") == 1  # print(engine): one line


def test_override_signature(engine: runmodel.Engine) -> None:
    with pytest.raises(
        TypeError,
        match=r"an override .*nop has signature \(engine.*\).*, but it "
        r"is called as fn\(engine, default\)",
    ):
        engine.override("runstep", nop)


def test_hook_signature_checked_when_decorating(engine: runmodel.Engine) -> None:
    decorate = engine.on("runstep")
    with pytest.raises(TypeError, match=r"fn\(engine\)"):
        decorate(lambda: None)
    decorate_override = engine.override("runstep")
    with pytest.raises(TypeError, match=r"fn\(engine, default\)"):
        decorate_override(nop)
    assert_nothing_registered(engine)


@pytest.mark.parametrize("priority", ["1", True, False, None, [1]])
def test_priority_must_be_a_number(engine: runmodel.Engine, priority: Any) -> None:
    with pytest.raises(
        TypeError,
        match=re.escape(f"priority= must be a number (higher runs first), got {priority!r}"),
    ):
        engine.on("runstep", nop, priority=priority)


@pytest.mark.parametrize("once", [True, 2, "2ep"])
def test_every_with_once(engine: runmodel.Engine, once: Any) -> None:
    with pytest.raises(ValueError, match="every= and once= exclude each other"):
        engine.on("runstep", nop, every=2, once=once)


@pytest.mark.parametrize("value", ["3 weeks", "ep", "two ep", "2", "", "-2ep", "2ep3"])
@pytest.mark.parametrize("option", ["every", "once"])
def test_unparseable_duration(engine: runmodel.Engine, option: str, value: str) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(f"{option}={value!r} is not a duration") + ".*one of ep, st, s, min, h",
    ):
        engine.on("runstep", nop, **{option: value})


def test_fractional_epochs_and_zero_durations(engine: runmodel.Engine) -> None:
    with pytest.raises(ValueError, match=r"every='1\.5ep': epochs and steps are whole numbers"):
        engine.on("runstep", nop, every="1.5ep")
    with pytest.raises(ValueError, match=r"once='0s' must be more than zero"):
        engine.on("runstep", nop, once="0s")
    with pytest.raises(ValueError, match=r"every='0s' must be more than zero"):
        engine.on("runstep", nop, every="0s")


@pytest.mark.parametrize("every", [0, -1])
def test_every_below_one(engine: runmodel.Engine, every: int) -> None:
    with pytest.raises(ValueError, match=f"every= must be at least 1, got {every}"):
        engine.on("runstep", nop, every=every)


@pytest.mark.parametrize("every", [2.5, True, [2]])
def test_every_wrong_type(engine: runmodel.Engine, every: Any) -> None:
    with pytest.raises(TypeError, match="every= takes a positive int or a duration"):
        engine.on("runstep", nop, every=every)


def test_a_negative_position_is_rejected(engine: runmodel.Engine) -> None:
    with pytest.raises(ValueError, match="once= must be at least 0, got -1"):
        engine.on("runstep", nop, once=-1)


def test_every_with_once_zero(engine: runmodel.Engine) -> None:
    with pytest.raises(ValueError, match="every= and once= exclude each other"):
        engine.on("runstep", nop, every=2, once=0)


@pytest.mark.parametrize("phase", [p for p in PHASES if p not in ACTION_PHASES])
def test_override_on_a_phase_without_action(engine: runmodel.Engine, phase: str) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"phase {phase!r} has no action to override; phases with an action: "
            + ", ".join(ACTION_PHASES)
            + f". Use engine.on({phase!r}) for a hook"
        ),
    ):
        engine.override(phase, nop_override)


@pytest.mark.parametrize("modes", [{"trian"}, "Train", ["train", "test"], set()])
def test_unknown_mode(engine: runmodel.Engine, modes: Any) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape("unknown mode(s)") + ".*" + re.escape("valid: " + ", ".join(MODES)),
    ):
        engine.on("runstep", nop, modes=modes)


@pytest.mark.parametrize("rank", [-1, True, "0", [], [0, -2], [0, None]])
def test_bad_rank(engine: runmodel.Engine, rank: Any) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(f"rank={rank!r}: give a process rank (an int >= 0) or a list of them"),
    ):
        engine.on("runstep", nop, rank=rank)


@pytest.mark.parametrize("option", ["before", "after"])
@pytest.mark.parametrize("value", [["a", ""], [3], ""])
def test_bad_constraint_names(engine: runmodel.Engine, option: str, value: Any) -> None:
    with pytest.raises(TypeError, match=f"{option}= takes a hook name or a list of names"):
        engine.on("runstep", nop, **{option: value})


@pytest.mark.parametrize("name", ["", 5])
def test_bad_name(engine: runmodel.Engine, name: Any) -> None:
    with pytest.raises(TypeError, match="name= must be a non-empty string"):
        engine.on("runstep", nop, name=name)


def test_when_not_callable_or_wrong_signature(engine: runmodel.Engine) -> None:
    with pytest.raises(TypeError, match="when= must be callable"):
        engine.on("runstep", nop, when=True)
    with pytest.raises(TypeError, match=r"when= .* but it is called as fn\(engine\)"):
        engine.on("runstep", nop, when=lambda: True)


@pytest.mark.parametrize(
    ("option", "value"), [("before", 5), ("after", 5), ("modes", 5), ("rank", 1.5)]
)
def test_non_iterable_option_names_the_option(
    engine: runmodel.Engine, option: str, value: Any
) -> None:
    with pytest.raises((TypeError, ValueError), match=f"{option}="):
        engine.on("runstep", nop, **{option: value})


def test_failed_registration_leaves_the_engine_as_it_was(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "kept")
    before = engine.describe()
    bad: list[dict[str, Any]] = [
        dict(every=0),
        dict(priority="x"),
        dict(modes={"nope"}),
        dict(rank=-1),
        dict(every=1, once=True),
        dict(before=[""]),
    ]
    for options in bad:
        with pytest.raises((TypeError, ValueError)):
            engine.on("runstep", nop, **options)
    assert engine.describe() == before
    one_step(engine)
    assert log == ["kept"]


# -- 5. handles ----------------------------------------------------------------------------


def test_plain_call_returns_an_attached_handle(engine: runmodel.Engine) -> None:
    log: list[str] = []
    handle = register(engine, log, "h")
    assert isinstance(handle, runmodel.HookHandle)
    assert handle.attached
    assert "runstep:h attached" in repr(handle)
    one_step(engine)
    handle.detach()
    assert not handle.attached
    assert "detached" in repr(handle)
    one_step(engine)
    assert log == ["h"]


def test_detach_twice_is_harmless(engine: runmodel.Engine) -> None:
    log: list[str] = []
    first = register(engine, log, "first")
    second = register(engine, log, "second")
    first.detach()
    first.detach()
    assert not first.attached and second.attached
    assert described_hooks(engine) == ["second"]
    one_step(engine)
    assert log == ["second"]


def test_context_manager_detaches_on_exit(engine: runmodel.Engine) -> None:
    log: list[str] = []
    with register(engine, log, "scoped") as handle:
        assert handle.attached
        assert described_hooks(engine) == ["scoped"]
        one_step(engine)
    assert not handle.attached
    assert described_hooks(engine) == []
    one_step(engine)
    assert log == ["scoped"]


def test_context_manager_detaches_on_error(engine: runmodel.Engine) -> None:
    log: list[str] = []
    with pytest.raises(KeyError), register(engine, log, "scoped") as handle:
        raise KeyError("boom")
    assert not handle.attached
    assert described_hooks(engine) == []


def test_decorated_handle_is_still_callable(engine: runmodel.Engine) -> None:
    calls: list[Any] = []

    @engine.on("runstep", priority=2, name="tally")
    def tally(e: runmodel.Engine, extra: str = "hook") -> str:
        calls.append((e, extra))
        return "returned"

    assert isinstance(tally, runmodel.HookHandle)
    assert tally.attached
    assert tally("by hand", extra="direct") == "returned"
    assert calls == [("by hand", "direct")]
    assert described_hooks(engine) == ["tally"]
    one_step(engine)
    assert calls == [("by hand", "direct"), (engine, "hook")]
    tally.detach()
    one_step(engine)
    assert len(calls) == 2
    assert tally("again") == "returned"  # still the function after detaching


def test_decorated_override_handle(engine: runmodel.Engine) -> None:
    @engine.override("runstep", name="wrap")
    def wrap(e: runmodel.Engine, default: Callable[[runmodel.Engine], Any]) -> Any:
        return default(e)

    assert isinstance(wrap, runmodel.HookHandle)
    assert described_overrides(engine) == ["wrap"]
    wrap.detach()
    assert described_overrides(engine) == []
    assert "action (wrapped)" not in engine.describe()


def test_describe_shows_then_drops_a_detached_hook(engine: runmodel.Engine) -> None:
    log: list[str] = []
    register(engine, log, "stays", phase="epoch_end")
    gone = register(engine, log, "goes", phase="epoch_start", every=2)
    text = engine.describe()
    assert described_hooks(engine, "epoch_start") == ["goes"]
    assert "every=2" in text
    gone.detach()
    assert described_hooks(engine, "epoch_start") == []
    assert described_hooks(engine, "epoch_end") == ["stays"]
    assert "goes" not in engine.describe()
    assert "(no hooks)" in next(
        line for line in engine.describe().splitlines() if line.startswith("epoch_start")
    )


def test_hook_that_detaches_itself_fires_once(engine: runmodel.Engine) -> None:
    log: list[int] = []
    handles: list[runmodel.HookHandle] = []

    def once_by_hand(e: runmodel.Engine) -> None:
        log.append(e.state.step)
        handles[0].detach()

    handles.append(engine.on("runstep", once_by_hand))
    engine.on("runstep", step_recorder(log), priority=-1)
    engine.run(Loop(batches=3), epochs=1)
    assert log == [0, 0, 1, 2]
    assert not handles[0].attached


def test_detaching_another_hook_mid_run(engine: runmodel.Engine) -> None:
    log: list[Any] = []
    victim = register(engine, log, "victim", phase="epoch_end")

    def killer(e: runmodel.Engine) -> None:
        if e.state.step == 5:
            victim.detach()

    engine.on("runstep", killer)
    engine.on("epoch_end", epoch_recorder(log))
    engine.run(Loop(batches=4), epochs=3)
    assert log == ["victim", 0, 1, 2]


# -- 6. overrides --------------------------------------------------------------------------


def tracer(log: list[str], tag: str) -> Callable[..., Any]:
    def wrap(engine: runmodel.Engine, default: Callable[[runmodel.Engine], Any]) -> Any:
        log.append(f"{tag}>")
        result = default(engine)
        log.append(f"<{tag}")
        return result

    return wrap


def test_three_overrides_nest_first_outermost(engine: runmodel.Engine) -> None:
    log: list[str] = []
    for tag in "abc":
        engine.override("runstep", tracer(log, tag), name=tag)
    engine.on("runstep", recorder(log, "hook"))
    model = Loop(batches=2, log=log)
    engine.run(model, epochs=1)
    one = ["a>", "b>", "c>", "action", "<c", "<b", "<a", "hook"]
    assert log == one * 2
    assert model.returned == [("out", (0, 0)), ("out", (0, 1))]
    assert described_overrides(engine) == ["a", "b", "c"]


def test_override_order_follows_priority_and_constraints(engine: runmodel.Engine) -> None:
    log: list[str] = []
    engine.override("runstep", tracer(log, "a"), name="a")
    engine.override("runstep", tracer(log, "b"), name="b", priority=5)
    engine.override("runstep", tracer(log, "c"), name="c", priority=9, after="a")
    engine.run(Loop(batches=1, log=log), epochs=1)
    assert log == ["b>", "a>", "c>", "action", "<c", "<a", "<b"]
    assert described_overrides(engine) == ["b", "a", "c"]


def test_override_sees_and_changes_the_result(engine: runmodel.Engine) -> None:
    def wrap(e: runmodel.Engine, default: Callable[[runmodel.Engine], Any]) -> None:
        default(e)
        e.state.output = ("wrapped", e.state.output)

    outputs: list[Any] = []
    engine.override("runstep", wrap)
    engine.on("runstep", lambda e: outputs.append(e.state.output))
    model = Loop(batches=2)
    engine.run(model, epochs=1)
    assert outputs == [("wrapped", ("out", (0, 0))), ("wrapped", ("out", (0, 1)))]
    assert model.returned == outputs


def test_override_without_default_replaces_the_action(engine: runmodel.Engine) -> None:
    log: list[str] = []

    def replace(e: runmodel.Engine, default: Callable[[runmodel.Engine], Any]) -> None:
        log.append("replaced")
        e.state.output = "mine"

    engine.override("runstep", tracer(log, "outer"), name="outer", priority=1)
    engine.override("runstep", replace)
    engine.override("runstep", tracer(log, "inner"), name="inner", priority=-1)
    engine.on("runstep", recorder(log, "hook"))
    model = Loop(batches=2, log=log)
    result = engine.run(model, epochs=1)
    assert log == ["outer>", "replaced", "<outer", "hook"] * 2  # no "action", no inner
    assert model.returned == ["mine", "mine"]
    assert result.steps == 2


def test_override_with_false_when_falls_through(engine: runmodel.Engine) -> None:
    log: list[str] = []
    engine.override("runstep", tracer(log, "never"), when=lambda e: False)
    engine.run(Loop(batches=2, log=log), epochs=1)
    assert log == ["action", "action"]


def test_override_filters_pick_the_steps_it_wraps(engine: runmodel.Engine) -> None:
    log: list[Any] = []

    def skip(e: runmodel.Engine, default: Callable[[runmodel.Engine], Any]) -> None:
        log.append(("skip", e.state.step))

    engine.override("runstep", skip, when=lambda e: e.state.step % 2 == 1, name="odd")
    engine.override("runstep", tracer(log, "third"), every=3, name="third")
    engine.override("runstep", tracer(log, "eval"), modes="eval", name="eval")
    engine.run(Loop(batches=6, log=log), epochs=1)
    assert log == [
        "action",  # 0
        ("skip", 1),  # 1
        "third>",
        "action",
        "<third",  # 2
        ("skip", 3),  # 3
        "action",  # 4
        ("skip", 5),
    ]  # 5: "third" never reached, "odd" did not call default


def test_override_detach_restores_the_action(engine: runmodel.Engine) -> None:
    log: list[str] = []
    handle = engine.override("runstep", lambda e, d: log.append("replaced"))
    engine.run(Loop(batches=1, log=log), epochs=1)
    handle.detach()
    engine.run(Loop(batches=1, log=log), epochs=1)
    assert log == ["replaced", "action"]


def tiny() -> Tiny:
    """A linear regression, SGD(lr=0.1), on the same batch twice an epoch: a step that
    learns nothing leaves the loss as it was."""
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    return Tiny(features=2, data=[(x, torch.tensor([[1.0], [0.0]]))] * 2)


def test_backward_overrides_compose_in_a_torch_train_step(engine: runmodel.Engine) -> None:
    log: list[str] = []
    model = tiny()

    def grads_present(tag: str) -> Callable[..., Any]:
        def wrap(e: runmodel.Engine, default: Callable[[runmodel.Engine], Any]) -> Any:
            log.append(f"{tag}>")
            default(e)
            log.append(f"<{tag} grad={model.module.weight.grad is not None}")

        return wrap

    engine.override("backward", grads_present("a"), name="a")
    engine.override("backward", grads_present("b"), name="b")
    for phase in ("forward", "backward", "optimizer_step"):
        engine.on(phase, recorder(log, phase))
    engine.run(model, epochs=1)
    step = ["forward", "a>", "b>", "<b grad=True", "<a grad=True", "backward", "optimizer_step"]
    assert log == step * 2


def test_backward_override_without_default_leaves_weights(engine: runmodel.Engine) -> None:
    model = tiny()
    start = [p.detach().clone() for p in model.module.parameters()]
    losses: list[float] = []
    engine.override("backward", lambda e, d: None)
    engine.on("forward", lambda e: losses.append(float(e.state.loss.detach())))
    result = engine.run(model, epochs=2)
    assert result.steps == 4
    assert all(torch.equal(a, b) for a, b in zip(start, model.module.parameters(), strict=True))
    assert len(set(losses)) == 1  # nothing learned

    trained = tiny()
    runmodel.Engine().run(trained, epochs=2)
    assert not torch.equal(start[0], trained.module.weight.detach())
