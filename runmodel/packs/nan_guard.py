"""Keep non-finite losses and gradients out of the weights: skip the step or stop."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import torch

from ..core import Hook, HookOptions, hook
from ..core.checks import whole_number
from ._common import refuse_closure_optimizer, require_phased_step, trained_parameters
from ._divergence import (
    TRAIN_MODES,
    Generators,
    StepGuard,
    agreed_failure,
    locate,
    record,
    world,
)

__all__ = ["NaNGuard"]

ACTIONS = ("skip", "stop")
#: ``locate="exact"`` copies the generators after every other ``step_start`` hook: those
#: may change the batch, drawing, and the replay starts from the batch they leave
LAST_PRIORITY = -1_000_000
_get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6


class NaNGuard(StepGuard):
    """After each backward, check that the loss and the gradients are finite; if not,
    the optimizer step is not taken and the gradients are zeroed, and then
    ``action="skip"`` goes on with the next batch (counted in ``skipped`` and
    ``state.metrics["nan_skipped"]``; the first skip of a run is also a warning), while
    ``action="stop"`` ends the run after this step with ``engine.stop(reason)``, e.g.
    ``"NaNGuard: non-finite loss at step 17 (epoch 1, batch 5)"``. The weights are never
    updated from a checked step with a non-finite loss or gradient, so checkpoints stay
    good.

    Each check reads the result back: on a GPU it is a device sync. ``every=N`` checks
    only every N-th step (``state.step`` N-1, 2N-1, ...); a non-finite value on an
    unchecked step goes through to the weights.

    With a GradScaler in ``engine.state.grad_scaler`` (the amp backend with float16)
    only the loss is checked: the scaler itself skips steps whose scaled gradients
    overflow and lowers its scale, which is routine in float16 training.

    With ``GradAccumulation`` the gradients checked are those accumulated so far, and a
    bad step drops its whole window: the window's optimizer step is not taken and its
    gradients are zeroed.

    ``locate=True``: when a check fails, the step is run again from its state before the
    update, with forward and backward hooks on every module, to name where the
    non-finite value starts: the first module to return one from finite inputs, else the
    first whose gradient became one, else the hook or override of the step (or the
    update of an earlier step) that made it. One line on stderr names it; the record goes
    to the run folder's ``divergence.json`` and ``engine.state.divergence``. Healthy
    steps pay nothing for it; the replay puts back the gradients, buffers and random
    generators it touched (``docs/divergence.md``). The replay draws its random numbers
    from where the step left the generators, so a NaN that only the step's own draws
    make (one dropout mask) may not appear again. ``locate="exact"`` copies the
    generators' states at the start of every checked step (one copy, replaced at each)
    and the replay starts from them: it draws what the step drew. That copy is the
    one cost it adds to a healthy step.

    In a distributed run (ddp, fsdp) the verdict is agreed: each check all-reduces one
    number, and a non-finite value on any process skips (or stops at) the step on all.
    """

    name = "nan_guard"
    repeatable = False  # a second one would compound the first
    writes = ("nan_skipped",)

    def __init__(
        self, action: str = "skip", every: int = 1, *, locate: bool | Literal["exact"] = False
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(
                f"NaNGuard action= must be 'skip' (skip the step and go on) or "
                f"'stop' (end the run), got {action!r}"
            )
        whole_number(every, "NaNGuard every=", least=1, meaning="check every N-th step")
        if not (isinstance(locate, bool) or locate == "exact"):
            raise ValueError(
                f"NaNGuard locate= must be False, True (replay a failed step, drawing "
                f"from where the step left the random generators) or 'exact' (replay it "
                f"from their states at the step's start, copied at every step), "
                f"got {locate!r}"
            )
        self.action, self.every, self.locate = action, every, locate
        self.skipped = 0  # optimizer steps not taken, over the whole training
        self.last: str | None = None  # what the latest one found
        self._found: str | None = None  # what this step (or window) found, until its step
        self._warned = False
        self._processes = 1  # the run's processes, which agree on each verdict
        # locate="exact": the generators' states at the start of the latest checked step
        self._start: tuple[int, Generators] | None = None

    def hooks(self) -> Iterator[Hook]:
        """The methods marked as hooks, and with ``locate="exact"`` ``keep_generators``
        on ``step_start``."""
        yield from super().hooks()
        if self.locate == "exact":
            yield Hook(
                self.keep_generators,
                "step_start",
                HookOptions.of(priority=LAST_PRIORITY, modes=TRAIN_MODES),
            )

    def keep_generators(self, engine: Any) -> None:
        """``locate="exact"``: the generators' states before a checked step draws, kept
        (in place of the last step's) for a replay of it to start from."""
        step = engine.state.step
        if self.every == 1 or (step + 1) % self.every == 0:
            self._start = step, Generators()

    def check_setup(self, engine: Any) -> None:
        """A closure optimizer is refused: its step cannot be skipped."""
        refuse_closure_optimizer(
            engine,
            type(self).__name__,
            "a non-finite loss or gradient found in one of its calls "
            "comes after the optimizer moved the weights for it, so "
            "the step cannot be skipped; leave NaNGuard out, or check "
            "the loss in a forward hook and stop the run",
        )

    @hook(modes=TRAIN_MODES)
    def setup(self, engine: Any) -> None:
        """A new run; in train mode, check that its step fires backward and
        optimizer_step (else this pack would never run)."""
        self._found, self._warned, self._processes = None, False, world()
        self._start = None
        require_phased_step(engine, type(self).__name__)

    @hook(priority=1000, modes=TRAIN_MODES)  # first: before hooks that read gradients
    def backward(self, engine: Any) -> None:
        """The check: the loss and, without a GradScaler, the gradients' total norm."""
        state = engine.state
        if self.every > 1 and (state.step + 1) % self.every:
            return
        loss = state.loss
        finite = torch.isfinite(loss.detach()).all()
        if state.grad_scaler is None:
            grads = self._grads(engine)
            if grads:
                norm = _total_norm(grads)
                finite = finite & torch.isfinite(norm).to(finite.device)
        failed = agreed_failure(finite, state.rank, self._processes)  # a sync, on a GPU
        if failed is not None:
            self._handle(engine, failed)

    def _dropped(self) -> None:
        self.skipped += 1

    @hook(modes=TRAIN_MODES)
    def epoch_end(self, engine: Any) -> None:
        engine.state.metrics["nan_skipped"] = self.skipped

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped, self.last = int(state.get("skipped", 0)), state.get("last")
        self._found = None  # a state between steps (a rollback leaves a found step behind)

    # -- when a check fails ------------------------------------------------------------

    def _handle(self, engine: Any, rank: int) -> None:
        s = engine.state
        where = "" if rank == s.rank else f" on process {rank}"
        what = self._what(engine) if rank == s.rank else "loss or gradient"
        message = (
            f"{type(self).__name__}: non-finite {what}{where} at step {s.step} "
            f"(epoch {s.epoch}, batch {s.epoch_step})"
        )
        self.last = message
        if self._found is not None:
            return  # this window is dropped already
        self._found = message
        if self.locate:
            self._locate(engine, message)
        if self.action == "stop":
            engine.stop(message)
        elif not self._warned:
            self._warned = True
            warnings.warn(
                f"{message}: the step is skipped; later skips are counted in "
                f"metrics['nan_skipped'] without a warning",
                RuntimeWarning,
                stacklevel=2,
            )

    def _locate(self, engine: Any, message: str) -> None:
        """Replay the step to name where its non-finite value starts: one line on
        stderr, a record in ``divergence.json`` and ``engine.state.divergence``."""
        step, start = self._start or (None, None)
        if step != engine.state.step:
            start = None  # not copied at this step's start: drawn from where it left them
        try:
            finding = locate(engine, start)
        except Exception as error:  # locating must not end the run
            # (a module that changes its input in place refuses full backward hooks)
            print(f"{message}: the replay that locates it failed: {error!r}", file=sys.stderr)
            return
        if finding is None:
            why = (
                "or a hook's or override's random draws"
                if start is not None
                else "or from random draws: locate='exact' replays the step's own"
            )
            print(
                f"{message}: not found again in a replay of the step on process "
                f"{engine.state.rank} (from another process's batch, {why})",
                file=sys.stderr,
            )
            return
        how = finding.pop("how")
        print(
            f"{message}: starts in {finding['module'] or 'the model'} ({finding['phase']}; "
            f"{how}; shape {tuple(finding['shape'])}, {finding['dtype']})",
            file=sys.stderr,
        )
        record(engine, {"guard": type(self).__name__, **finding, "rank": engine.state.rank})

    def _what(self, engine: Any) -> str:
        """``loss``, or the gradient of the first parameter whose gradient is not finite."""
        if not bool(torch.isfinite(engine.state.loss.detach()).all()):
            return "loss"
        module = getattr(engine.model, "module", None)
        names = {id(p): n for n, p in module.named_parameters()} if module is not None else {}
        for i, p in enumerate(trained_parameters(engine.model)):
            if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                return f"gradient of {names.get(id(p), f'parameter {i}')!r}"
        return "gradient norm"  # each finite, their norm not: beyond float range

    @staticmethod
    def _grads(engine: Any) -> list[torch.Tensor]:
        optimizer = engine.model.optimizer
        if optimizer is None:  # the update is an override's: the module's parameters
            return [p.grad for p in trained_parameters(engine.model) if p.grad is not None]
        return [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all of ``grads`` together (NaN if one holds a NaN, inf if one an inf)."""
    if _get_total_norm is not None:  # torch >= 2.6: grouped by device and dtype, fused
        return _get_total_norm(grads)
    device = grads[0].device
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g).to(device) for g in grads])
    )
