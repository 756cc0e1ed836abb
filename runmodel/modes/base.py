"""A mode with its options: what ``engine.run(model, mode)`` is given, checked when made."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ..core import BareEngine, StepPlan

__all__ = ["Mode", "check_steps_for", "model_step"]


class Mode:
    """A mode: ``name`` (one of ``runmodel.MODES``), ``kind`` (the step it runs: train,
    eval or infer), its step ``budget`` and its ``plan`` for a model. Subclasses check
    their options in ``__init__``, before anything runs."""

    name: ClassVar[str]

    @property
    def kind(self) -> str:
        return self.name

    def budget(self, steps: int | None) -> int | None:
        """The step budget of a run given ``steps``."""
        return steps

    def plan(self, engine: BareEngine, model: Any) -> StepPlan:
        raise NotImplementedError

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({options})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))


def model_step(model: Any) -> Any:
    """The runstep action of a model that is not a ``TorchModel``: its ``step(batch)``."""
    step = model.step

    def runstep(engine: Any) -> None:
        state = engine.state
        state.output = step(state.batch)

    return runstep


def check_steps_for(mode: str, model: Any, *names: str, hint: str = "") -> None:
    """``model`` has the parts a ``mode`` step needs; ``hint`` ends the error."""
    missing = [n for n in names if getattr(model, n, None) is None]
    if missing:
        raise ValueError(
            f"{mode} mode needs {type(model).__name__}."
            f"{' and .'.join(missing)}; set {'them' if len(missing) > 1 else 'it'} "
            f"in __init__ (module) or setup() (optimizer, loss_fn, data){hint}"
        )
