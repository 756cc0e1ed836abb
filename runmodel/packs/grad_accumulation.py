"""Accumulate gradients over k micro-batches before each optimizer step."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ..core import Pack, hook, override
from ..core.checks import whole_number
from ._common import refuse_closure_optimizer, require_optimizer, require_phased_step

__all__ = ["GradAccumulation"]

#: The modes whose steps may be train steps (benchmark and profile can measure them).
TRAIN_MODES = ("train", "benchmark", "profile")


class GradAccumulation(Pack):
    """Step the optimizer once every ``k`` steps (micro-batches), on the sum of their
    gradients, each loss scaled by ``1/k``: for a mean-reduced loss, ``k`` batches of
    ``B`` rows make the step one batch of ``k*B`` rows would.

    Windows are counted within the epoch, from ``state.epoch_step``: the optimizer
    steps after the k-th, 2k-th, ... step of each epoch, and at the end of the epoch
    when its step count is not a multiple of ``k`` (a shorter last window, still scaled
    by ``1/k``, as PyTorch Lightning and the usual hand-written loop do). So the
    position in a window is a function of the run's counters, and a resumed run (which
    starts an epoch's data from its beginning) starts a new window with it.

    Overrides ``backward`` (the loss divided by ``k``; hooks still see the true loss) and
    ``optimizer_step`` at priority 300, outside every other built-in override: clipping
    (``GradClip``), ``NaNGuard`` and the amp backend's GradScaler step run once per real
    step, on the accumulated gradient. ``optimizer_step`` *hooks* still fire at every
    step, since the phase does.

    ``state.iteration`` counts the windows (the engine reads ``steps_per_iteration``).

    A stop inside a window: an interrupt (Ctrl-C, a preemption signal) leaves the window
    as it is, and a checkpoint taken inside a window (by an interrupt, or by
    ``Checkpoint(every="Nst")``) holds the gradients accumulated so far in this pack's
    state; the run resumed from it puts them back and completes the window, so it takes
    the straight run's optimizer steps, bit for bit (``docs/packs/grad_accumulation.md``). (Saved
    rather than completed before the stop: a preemption's grace time is not spent on up
    to ``k - 1`` more steps, and a save of ``every=`` stays at its step.) ``stop()`` and
    the step budget end the epoch, which steps its shorter last window as above.

    Under the ``fsdp`` backend the accumulating steps skip the gradient reduction
    (``set_requires_gradient_sync(False)``): only a window's last backward (or the
    epoch's last, by ``len(train_data)``) reduces the summed gradients across the
    processes. Training data without a length syncs every step. There the window's
    gradients are not saved (each process holds its own, not yet reduced): a run
    interrupted inside a window drops it, with a warning.
    """

    name = "grad_accumulation"
    repeatable = False  # a second one would compound the first

    def __init__(self, k: int) -> None:
        whole_number(
            k,
            "GradAccumulation(k): k, the number of steps (micro-batches) per optimizer step,",
            least=1,
        )
        self.k = k
        # the optimizer_step chain inside this override, kept from the latest step for
        # the step at an epoch's end
        self._step: Callable[[Any], Any] | None = None
        # fsdp: the module's switch for gradient reduction, and the epoch's length
        self._sync: Callable[[bool], Any] | None = None
        self._length: int | None = None
        self._unsynced = False
        # a window's gradients not yet stepped on (a checkpoint keeps them), and those a
        # checkpoint gave back, put into the parameters as the run starts
        self._holding = False
        self._module: Any = None
        self._saved_grads: list[Any] | None = None

    @property
    def steps_per_iteration(self) -> int:
        """The steps (micro-batches) of one iteration: ``k``."""
        return self.k

    def check_setup(self, engine: Any) -> None:
        """The model's optimizer, and one that takes no closure."""
        name = type(self).__name__
        require_optimizer(
            engine, name, "steps the optimizer once per window and zeroes its gradients"
        )
        refuse_closure_optimizer(
            engine,
            name,
            "each step recomputes the loss and its "
            "gradients from scratch, so there is nothing "
            "to accumulate across batches",
        )

    @hook(modes=TRAIN_MODES)
    def setup(self, engine: Any) -> None:
        """A new run; in train mode, check that its step fires backward and
        optimizer_step (else this pack would never run)."""
        self._step = None
        require_phased_step(engine, type(self).__name__)
        model = engine.model
        self._sync = getattr(getattr(model, "module", None), "set_requires_gradient_sync", None)
        try:
            self._length = len(model.train_data)
        except TypeError:  # no train_data, or no length: sync every step
            self._sync = None
        self._unsynced = False
        self._module = getattr(model, "module", None)
        grads, self._saved_grads = self._saved_grads, None
        self._holding = grads is not None
        if grads is not None:  # a checkpoint taken inside a window: its gradients so far
            for parameter, grad in zip(self._module.parameters(), grads, strict=True):
                parameter.grad = None if grad is None else grad.to(parameter.device)

    @override("backward", priority=300, modes=TRAIN_MODES)
    def scaled_backward(self, engine: Any, default: Callable[[Any], Any]) -> None:
        """Backward on ``loss / k``; ``state.loss`` is the true loss again afterwards."""
        state = engine.state
        if self._sync is not None:  # fsdp: reduce at a window's last backward only
            last = (
                (state.epoch_step + 1) % self.k == 0
                or state.epoch_step + 1 >= (self._length or 0)
                or (state.max_steps is not None and state.step + 1 >= state.max_steps)
            )
            if last == self._unsynced:  # a change: the switch walks every shard unit
                self._sync(last)
            self._unsynced = not last
        loss = state.loss
        state.loss = loss / self.k
        try:
            default(engine)
        finally:
            state.loss = loss

    @override("optimizer_step", priority=300, modes=TRAIN_MODES)
    def accumulate(self, engine: Any, default: Callable[[Any], Any]) -> None:
        """Step (and zero the gradients) only at the end of a window."""
        self._step = default
        self._holding = (engine.state.epoch_step + 1) % self.k != 0
        if not self._holding:
            default(engine)

    @hook(priority=1000, modes=TRAIN_MODES)  # first: checkpoints and metrics see the step
    def epoch_end(self, engine: Any) -> None:
        """Step on the epoch's last, shorter window, if it has one (not on an epoch that an
        interrupt cut short: its window goes on after the resume)."""
        s = engine.state
        if self._step is not None and s.epoch_step % self.k:
            if s.interrupted and not s.epoch_complete and not self._unsynced:
                return
            self._holding = False
            if self._unsynced:  # an epoch cut short mid-window: its gradients were never
                # reduced, and stepping on them would set the processes apart
                warnings.warn(
                    f"GradAccumulation: the epoch ended after step "
                    f"{engine.state.step} in the middle of a window; under fsdp "
                    f"its gradients were not reduced across the processes, so "
                    f"the window is dropped",
                    stacklevel=2,
                )
                engine.model.optimizer.zero_grad()
            else:
                self._step(engine)
            # after the step (LRSchedule(lr_at=) read the window's iteration): the next
            # epoch's first window starts at a whole iteration
            engine.state.window_padding += self.k - engine.state.epoch_step % self.k

    @hook(priority=-10_000)  # after a Checkpoint's last save, which keeps a window's gradients
    def teardown(self, engine: Any) -> None:
        if self._sync is not None and self._unsynced:
            self._sync(True)
        self._sync, self._unsynced = None, False
        self._step = self._module = None  # they hold the model; let it go with the run
        self._holding = False

    def state_dict(self) -> dict[str, Any]:
        """Inside a window (and not under fsdp): the gradients accumulated so far."""
        if not self._holding or self._module is None or self._sync is not None:
            return {}
        return {
            "grads": [
                None if p.grad is None else p.grad.detach().clone()
                for p in self._module.parameters()
            ]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        grads = state.get("grads")
        self._saved_grads = None if grads is None else list(grads)
