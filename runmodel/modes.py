"""What a run does in each mode: the built-in actions, and what a mode adds around them.

``build_mode`` returns a ``ModeRun``: the actions of the action phases (wrapped by their
override chains in the engine), built-ins that run before or after a phase's hooks, a
context around ``model.run`` (``no_grad``, the profiler), a wrapper for hooks (profile
mode times them) and a ``finish`` that adds outputs, timings and files to the result.
The engine reads chains and hook tuples from ``tables`` on every call, so hooks added
mid-run take effect at the next event.

    train      forward, backward, optimizer_step
    eval       forward without grad; ignite metrics into state.metrics at epoch_end
    infer      forward without grad; outputs collected (or only streamed to hooks)
    benchmark  a train or infer step, timed; warm-up steps dropped
    profile    a train or infer step under torch.profiler; hooks timed
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .interface import Interface, Supervised
from .model import Model, TorchModel

if TYPE_CHECKING:
    from ignite.metrics import Metric

    from .engine import Engine
    from .hooks import Hook

__all__ = ["DEFAULT_WARMUP", "FUSED", "TIMED_STEPS", "MetricSet", "ModeRun", "build_mode",
           "check_timed", "evaluate", "step_kind", "timed_steps"]

Action = Callable[["Engine"], Any]

#: Key of an optional runstep action that does the work of the forward, backward and
#: optimizer_step phases in one call; used only while none of them has hooks or overrides.
FUSED = "runstep:fused"
DEFAULT_WARMUP = 5
TIMED_STEPS = 55  # benchmark/profile steps when none are given: 50 after the warm-up


@dataclass
class ModeRun:
    """A mode, ready for one run of one model."""

    kind: str
    actions: dict[str, Action]
    before: dict[str, list[Action]] = field(default_factory=dict)
    after: dict[str, list[Action]] = field(default_factory=dict)
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    wrap_hook: Callable[[Hook, Callable[..., Any]], Callable[..., Any]] | None = None
    finish: Callable[[Engine], dict[str, Any]] = lambda engine: {}


def build_mode(mode: str, model: Model, tables: Any, *, measure: str = "train",
               warmup: int = DEFAULT_WARMUP, collect: bool = True,
               directory: Path | None = None, steps: int | None = None) -> ModeRun:
    """The ``mode`` for ``model``; checked before the first step."""
    kind = step_kind(mode, measure)
    if kind == "train":
        run = _train(model, tables, fused=mode != "profile")
    elif kind == "eval":
        run = _evaluate(model)
    else:
        run = _infer(model, collect and mode == "infer")
    if mode == "benchmark":
        _benchmark(run, model, warmup, steps or 0)
    elif mode == "profile":
        _profile(run, model, warmup, steps or 0, directory)
    return run


def step_kind(mode: str, measure: str) -> str:
    """The step a mode runs: ``train``, ``eval`` or ``infer`` (benchmark and profile run
    the ``measure`` step)."""
    return measure if mode in ("benchmark", "profile") else mode


# -- train ------------------------------------------------------------------------------

def _model_step(model: Model) -> Action:
    step = model.step

    def runstep(engine: Engine) -> None:
        state = engine.state
        state.output = step(state.batch)
    return runstep


def _require(model: TorchModel, mode: str, *names: str) -> None:
    missing = [n for n in names if getattr(model, n, None) is None]
    if missing:
        raise ValueError(f"{mode} mode needs {type(model).__name__}."
                         f"{' and .'.join(missing)}; set {'them' if len(missing) > 1 else 'it'} "
                         f"in __init__ (module) or setup() (optimizer, loss_fn, data)")


def _custom_interface(model: Model) -> Interface | None:
    """The model's interface when it is not the supervised one the phases implement."""
    interface = getattr(model, "interface", None)
    return None if interface is None or type(interface) is Supervised else interface


def _interface_train_step(model: Model, interface: Interface) -> Action:
    train_step = interface.train_step

    def runstep(engine: Engine) -> None:
        state = engine.state
        state.output = result = train_step(model, state.batch)
        state.loss = result.get("loss") if isinstance(result, dict) else None
    return runstep


def _train(model: Model, tables: Any, fused: bool) -> ModeRun:
    if (interface := _custom_interface(model)) is not None:
        return ModeRun("train", {"runstep": _interface_train_step(model, interface)})
    if not isinstance(model, TorchModel):
        return ModeRun("train", {"runstep": _model_step(model)})
    _require(model, "train", "module", "optimizer", "loss_fn")
    compute_output, compute_loss = model.compute_output, model.compute_loss
    module, loss_fn = model.module, model.loss_fn
    module.train()
    # The optimizer is read at each step (a hook may replace it; checkpoints save the
    # model's); module and loss function are taken here, after setup and the backend.

    def forward(engine: Engine) -> None:
        state = engine.state
        state.output = output = compute_output(state.batch)
        state.loss = compute_loss(output, state.batch)

    def backward(engine: Engine) -> None:
        engine.state.loss.backward()

    def optimizer_step(engine: Engine) -> None:
        optimizer = model.optimizer
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def phased_step(engine: Engine) -> None:
        t = tables
        t.forward_action(engine)
        for hook in t.forward:
            hook(engine)
        t.backward_action(engine)
        for hook in t.backward:
            hook(engine)
        t.optimizer_step_action(engine)
        for hook in t.optimizer_step:
            hook(engine)

    def fused_step(engine: Engine) -> None:
        # phased_step with forward, backward and optimizer_step bare: the same work
        # in one call, which the engine installs while those phases have no hooks.
        state = engine.state
        state.output = output = compute_output(state.batch)
        state.loss = loss = compute_loss(output, state.batch)
        loss.backward()
        optimizer = model.optimizer
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def fused_default_step(engine: Engine) -> None:
        # fused_step with TorchModel's own compute_output and compute_loss inlined
        state = engine.state
        batch = state.batch
        state.output = output = module(batch[0])
        state.loss = loss = loss_fn(output, batch[1])
        loss.backward()
        optimizer = model.optimizer
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    actions: dict[str, Action] = {"runstep": phased_step, "forward": forward,
                                  "backward": backward, "optimizer_step": optimizer_step}
    if fused:
        own = type(model)
        parts = ("compute_output", "compute_loss", "target")
        default_parts = (all(getattr(own, p) is getattr(TorchModel, p) for p in parts)
                         and not any(p in vars(model) for p in parts))  # none set on it
        actions[FUSED] = fused_default_step if default_parts else fused_step
    return ModeRun("train", actions)


# -- eval and infer ---------------------------------------------------------------------

@contextlib.contextmanager
def _inference(model: Model) -> Iterator[None]:
    """No grad, and the module in eval mode; its training flag is restored after."""
    module = model.module if isinstance(model, TorchModel) else None
    training = module is not None and module.training
    if module is not None:
        module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if training:
            module.train()


class MetricSet:
    """pytorch-ignite metrics fed ``(output, target)``; computed into a dict of floats."""

    def __init__(self, metrics: dict[str, Metric]) -> None:
        self.metrics = metrics

    def reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()

    def update(self, output: Any, target: Any) -> None:
        for metric in self.metrics.values():
            metric.update((output, target))

    def compute(self) -> dict[str, Any]:
        computed = {name: metric.compute() for name, metric in self.metrics.items()}
        return {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v
                for k, v in computed.items()}


def evaluate(model: TorchModel, data: Iterable[Any] | None = None) -> dict[str, Any]:
    """The model's ``metrics()`` over ``data`` (default: its eval data), without grad and
    outside any run: for a hook that checks a model mid-training (no ``setup()`` is
    called, so training state is untouched)."""
    metrics = MetricSet(model.metrics())
    metrics.reset()
    data = model.data_for("eval") if data is None else data
    move = None if model.device.type == "cpu" else model.to_device
    with _inference(model):
        for batch in data:
            batch = batch if move is None else move(batch)
            metrics.update(model.compute_output(batch), model.target(batch))
    return metrics.compute()


def _output_fn(model: TorchModel) -> Callable[[Any], Any]:
    """What computes an eval or infer step's output: the model's ``compute_output``, or
    its interface's ``inference`` when it has its own interface."""
    interface = _custom_interface(model)
    if interface is None:
        return model.compute_output
    return lambda batch: interface.inference(model, batch)


def _evaluate(model: Model) -> ModeRun:
    if not isinstance(model, TorchModel):
        return ModeRun("eval", {"runstep": _model_step(model)}, context=lambda: _inference(model))
    _require(model, "eval", "module")
    metrics = MetricSet(model.metrics())
    compute_output, target, loss_fn = _output_fn(model), model.target, model.loss_fn
    compute_loss = model.compute_loss

    def eval_step(engine: Engine) -> None:
        state = engine.state
        batch = state.batch
        state.output = output = compute_output(batch)
        if loss_fn is not None:
            state.loss = compute_loss(output, batch)
        metrics.update(output, target(batch))

    def reset(engine: Engine) -> None:
        metrics.reset()

    def compute(engine: Engine) -> None:
        engine.state.metrics.update(metrics.compute())

    return ModeRun("eval", {"runstep": eval_step}, before={"epoch_start": [reset],
                                                          "epoch_end": [compute]},
                   context=lambda: _inference(model))


def _infer(model: Model, collect: bool) -> ModeRun:
    if isinstance(model, TorchModel):
        _require(model, "infer", "module")
        compute_output = _output_fn(model)

        def infer_step(engine: Engine) -> None:
            state = engine.state
            state.output = compute_output(state.batch)
    else:
        infer_step = _model_step(model)
    outputs: list[Any] = []
    run = ModeRun("infer", {"runstep": infer_step}, context=lambda: _inference(model))
    if collect:
        run.after["runstep"] = [lambda engine: outputs.append(engine.state.output)]
        run.finish = lambda engine: {"outputs": outputs}
    return run


# -- benchmark --------------------------------------------------------------------------

def _device(model: Model) -> torch.device:
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")


def batch_size(batch: Any) -> int | None:
    """The leading size of the first tensor in a batch, if it has one."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = batch.values() if isinstance(batch, dict) else (
        batch if isinstance(batch, (list, tuple)) else ())
    for value in values:
        if (size := batch_size(value)) is not None:
            return size
    return None


def check_timed(mode: str, measure: str, warmup: int, steps: int) -> None:
    """Benchmark and profile options, checked before the run starts."""
    if measure not in ("train", "infer"):
        raise ValueError(f"measure={measure!r}: benchmark and profile measure a 'train' or "
                         f"'infer' step")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup= must be a whole number >= 0, got {warmup!r}")
    if steps <= warmup:
        raise ValueError(f"{mode} mode needs more steps ({steps}) than warm-up steps "
                         f"({warmup}), or nothing is measured")


def timed_steps(steps: int | None, warmup: int) -> int:
    """Benchmark and profile steps: as given, or the warm-up and then 50 measured."""
    return warmup + TIMED_STEPS - DEFAULT_WARMUP if steps is None else steps


class StepTimer:
    """Times each step from step_start to the end of its runstep hooks.

    On CUDA each step records a pair of preallocated events and the device is
    synchronised only at the two ends of the measured window (after the warm-up and at
    the end); on the CPU the clock is read directly.
    """

    def __init__(self, device: torch.device, warmup: int, steps: int) -> None:
        self.warmup, self.n, self.samples = warmup, 0, 0
        self.cuda = device.type == "cuda"
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        if self.cuda:
            self.events = [(torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        self.times = [0] * steps
        self.began = self.window_start = self.window_end = 0

    def start(self, engine: Engine) -> None:
        if self.n == self.warmup:
            self.sync()
            self.window_start = time.perf_counter_ns()
        if self.cuda:
            self.events[self.n][0].record()
        else:
            self.began = time.perf_counter_ns()

    def stop(self, engine: Engine) -> None:
        n = self.n
        if self.cuda:
            self.events[n][1].record()
        else:
            self.times[n] = time.perf_counter_ns() - self.began
        if n >= self.warmup:
            self.samples += batch_size(engine.state.batch) or 0
            self.window_end = time.perf_counter_ns()  # the window ends with the last step
        self.n = n + 1

    def finish(self, engine: Engine) -> dict[str, Any]:
        self.sync()
        measured = self.n - self.warmup
        if measured <= 0:
            return {"timings": {"warmup": self.warmup, "measured_steps": 0}}
        wall = (self.window_end - self.window_start) / 1e9
        if self.cuda:
            ms = [a.elapsed_time(b) for a, b in self.events[self.warmup:self.n]]
            # on the device's clock: from the first measured step's start to the last's end
            wall = self.events[self.warmup][0].elapsed_time(self.events[self.n - 1][1]) / 1e3
        else:
            ms = [t / 1e6 for t in self.times[self.warmup:self.n]]
        ms.sort()
        timings = {"warmup": self.warmup, "measured_steps": measured, "seconds": wall,
                   "steps_per_s": measured / wall,
                   "samples_per_s": self.samples / wall if self.samples else None,
                   "step_ms_median": statistics.median(ms),
                   "step_ms_p90": ms[min(len(ms) - 1, int(0.9 * len(ms)))],
                   "step_ms_mean": sum(ms) / len(ms), "device": str(
                       "cuda" if self.cuda else "cpu")}
        return {"timings": timings}


def _benchmark(run: ModeRun, model: Model, warmup: int, steps: int) -> None:
    check_timed("benchmark", "train", warmup, steps)
    timer = StepTimer(_device(model), warmup, steps)
    run.before.setdefault("step_start", []).insert(0, timer.start)
    run.after.setdefault("runstep", []).append(timer.stop)
    run.finish = timer.finish


# -- profile ----------------------------------------------------------------------------

def _profile(run: ModeRun, model: Model, warmup: int, steps: int,
             directory: Path | None) -> None:
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    check_timed("profile", "train", warmup, steps)
    directory = Path(directory or Path("runs") / f"profile-{type(model).__name__}-"
                     f"{time.strftime('%Y%m%d-%H%M%S')}")
    directory.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if _device(model).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    profiler = profile(activities=activities,
                       schedule=schedule(wait=0, warmup=warmup, active=steps - warmup, repeat=1),
                       on_trace_ready=tensorboard_trace_handler(str(directory)))
    for phase, action in list(run.actions.items()):
        def labelled(engine: Engine, action: Action = action, label: str = f"runmodel/{phase}"
                     ) -> Any:
            with record_function(label):
                return action(engine)
        labelled.__wrapped__ = action  # type: ignore[attr-defined]  # errors name the action
        run.actions[phase] = labelled
    table: dict[tuple[str, str], list[float]] = {}

    def wrap_hook(hook: Hook, fn: Callable[..., Any]) -> Callable[..., Any]:
        label = f"runmodel/{hook.phase}/{hook.name}"
        stat = table.setdefault((hook.phase, hook.name), [0, 0.0])

        def timed(*args: Any) -> Any:
            with record_function(label):
                start = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    stat[0] += 1
                    stat[1] += time.perf_counter() - start
        return timed

    def finish(engine: Engine) -> dict[str, Any]:
        traces = sorted(directory.glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime)
        hooks = [{"phase": phase, "hook": name, "calls": int(calls), "total_ms": total * 1e3,
                  "mean_us": total / calls * 1e6 if calls else 0.0}
                 for (phase, name), (calls, total) in table.items()]
        hooks.sort(key=lambda row: -row["total_ms"])
        files = {"directory": str(directory)}
        if traces:
            files["trace"] = str(traces[-1])
        return {"timings": {"warmup": warmup, "hooks": hooks}, "files": files}

    run.context = lambda: profiler
    run.after.setdefault("runstep", []).append(lambda engine: profiler.step())
    run.wrap_hook = wrap_hook
    run.finish = finish
