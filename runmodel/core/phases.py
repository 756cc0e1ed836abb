"""The phases of a run, in firing order.

A run is the pseudocode below; every ``fire(name)`` runs that phase's hooks in their
resolved order, and every ``action(name)`` is the built-in work of the phase, which
``engine.override(name)`` can wrap or replace. Hooks of a phase with an action run
after the action, so they see its result in ``engine.state``; ``engine.fire(name)`` does
both, and is how a mode's step runs the phases inside it::

    model.setup(setup_options); backend.initialize(model, spec); load the checkpoint
    pack.check_setup(engine) for each pack      # setup-time checks, before any hook
    fire("setup")
    try:
        [eval mode: fire("eval_start")]         # once, before the first epoch_start
        model.run(runstep, steps)               # the model owns its loop:
            for epoch in runstep.epochs():      #   fire("epoch_start") first
                for batch in data:
                    runstep(batch)              #   one step:
                        fire("step_start")      #     engine.skip_step() may drop the batch here
                        action("runstep")       #     the mode's step; in train mode:
                            action("forward");        fire("forward")
                            action("backward");       fire("backward")
                            action("optimizer_step"); fire("optimizer_step")
                        fire("runstep")
                fire("epoch_end")               #   where the Evaluate pack evaluates: each
                                                #   pass of runmodel.evaluate(engine=) is
                                                #   fire("eval_start") ... fire("eval_end")
        [eval mode: fire("eval_end")]           # once, after the last epoch_end
    except BaseException:
        fire("exception")                       # engine.state.error holds it; then re-raised
    finally:
        fire("teardown"); model.teardown()      # always, once setup began

With a closure optimizer (``torch.optim.LBFGS``: its ``step`` takes the closure it
calls), ``action("optimizer_step")`` is ``optimizer.step(closure)`` and the closure fires
``forward`` and ``backward`` at each of its calls.

``docs/phases.md`` is the long form of this table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACTION_PHASES", "MODES", "PHASES", "Phase"]


@dataclass(frozen=True, slots=True)
class Phase:
    """A phase's fixed facts.

    ``scope`` says which counters advance between two of its events: ``"step"`` phases
    fire once per step, ``"epoch"`` phases once per epoch, ``"run"`` phases once per run,
    ``"eval"`` phases once per evaluation pass. It decides what ``every=N`` counts.
    """

    name: str
    scope: str
    has_action: bool
    doc: str


PHASES: dict[str, Phase] = {
    p.name: p
    for p in (
        Phase("setup", "run", False, "once, after model.setup() and the backend's initialize"),
        Phase("epoch_start", "epoch", False, "start of each epoch"),
        Phase("step_start", "step", False, "before each runstep; skip_step() drops the batch"),
        Phase("runstep", "step", True, "each runstep; the action is the mode's step"),
        Phase("forward", "step", True, "inside a train step: compute outputs and loss"),
        Phase("backward", "step", True, "inside a train step: loss.backward()"),
        Phase("optimizer_step", "step", True, "inside a train step: optimizer.step(), zero grads"),
        Phase("epoch_end", "epoch", False, "end of each epoch"),
        Phase(
            "eval_start",
            "eval",
            False,
            "before every evaluation pass (runmodel.evaluate, "
            "the Evaluate pack's; once in eval mode)",
        ),
        Phase("eval_end", "eval", False, "after every evaluation pass"),
        Phase("exception", "run", False, "anything raised during the run; state.error holds it"),
        Phase("teardown", "run", False, "always once setup began, before model.teardown()"),
    )
}

ACTION_PHASES: tuple[str, ...] = tuple(p for p, spec in PHASES.items() if spec.has_action)

MODES: tuple[str, ...] = ("train", "eval", "infer", "benchmark", "profile")
