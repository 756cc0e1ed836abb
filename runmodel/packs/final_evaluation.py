"""The evaluation a run in a folder ends with: the trained model on its eval data
(``eval_*``), then its test data with the best checkpoint's weights (``test_*``)."""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..backends.distributed.env import broadcast_from_0
from ..core import Hook, HookOptions, Pack

if TYPE_CHECKING:
    from ..checkpoint.storage import Storage

__all__ = ["FinalEvaluation"]


class FinalEvaluation(Pack):
    """Once a train run ended without an error (its budget, its epochs, or ``stop()``),
    the model's interface evaluates it (``interface.evaluate``, the same measure
    ``runmodel eval`` takes):

    - ``trained``: the trained weights on the model's ``eval_data``, as ``eval_*``
      metrics of the run's result;
    - ``tested``: where the model has ``test_data``, the test split once, with the weights
      of the best checkpoint (rank 0's Checkpoint pack names it; every process loads it)
      or, without one, the trained weights, as ``test_*`` metrics; the weights used are the
      result's ``files["test_weights"]``, and the model is left with its trained weights.
      Under a sharded storage (``fsdp``) the trained weights are used.

    Every process of a distributed run takes part (the processes agreed that they ended
    together first): each evaluates its share of the data, as the ``Evaluate`` pack's
    does. A run given a folder (``engine.run(..., run_dir=)``, every config and model
    source run) has one; its ``RunFolder`` records what it measured in ``metrics.json``.
    """

    name = "final_evaluation"

    def __init__(self, trained_weights: str | Path | None = None) -> None:
        #: the file of the trained weights (``model.pt``), named when no best checkpoint
        #: is tested
        self.trained_weights = None if trained_weights is None else Path(trained_weights)

    def hooks(self) -> Iterator[Hook]:
        # after the run folder wrote model.pt (priority 1000), before the backend's own
        # teardown puts its data back
        yield Hook(
            self.trained,
            "teardown",
            HookOptions.of(priority=999, modes="train", name="final_evaluation.trained"),
        )
        # after the Checkpoint packs' last save (priority 0), which names the best
        yield Hook(
            self.tested,
            "teardown",
            HookOptions.of(priority=-500, modes="train", name="final_evaluation.tested"),
        )

    def trained(self, engine: Any) -> None:
        """The trained weights on the eval data: ``eval_*``."""
        s, model = engine.state, engine.model
        interface = getattr(model, "interface", None)
        data = getattr(model, "eval_data", None)
        if s.error is not None or interface is None or data is None:
            return
        with contextlib.suppress(NotImplementedError):
            evaluated = interface.evaluate(model, data)
            s.metrics.update({f"eval_{k}": v for k, v in evaluated.items()})

    def tested(self, engine: Any) -> None:
        """The best weights on the test data: ``test_*``."""
        s, model = engine.state, engine.model
        interface = getattr(model, "interface", None)
        data = getattr(model, "test_data", None)
        storage = cast("Storage", engine.storage)
        if s.error is not None or interface is None or data is None:
            return
        if not storage.ended_together:
            return
        sharded = storage.group is not None
        best = broadcast_from_0(None if sharded else s.files.get("best_checkpoint"))
        kept = _load_best(model, Path(best)) if best else None
        try:
            with contextlib.suppress(NotImplementedError):
                tested = interface.evaluate(model, data)
                s.metrics.update({f"test_{k}": v for k, v in tested.items()})
        finally:
            if kept is not None:
                model.load_state_dict(kept)
        used = Path(str(best)) if kept is not None else self.trained_weights
        if s.rank == 0 and used is not None and used.exists():
            s.files["test_weights"] = str(used)


def _load_best(model: Any, best: Path) -> Any:
    """Load the weights of the checkpoint ``best`` into ``model`` (its optimizer left
    alone); returns the state to put back after, or None where the checkpoint cannot be
    read (said on stderr: the trained weights are tested instead)."""
    from ..checkpoint.export import model_state

    try:
        state = model_state(best)
    except (OSError, ValueError) as error:
        print(
            f"runmodel: the test split is evaluated with the trained weights: the best "
            f"checkpoint {best} cannot be read ({error})",
            file=sys.stderr,
        )
        return None
    kept = model.state_dict()
    if isinstance(kept, dict) and "optimizer" in kept:
        kept = {**kept, "optimizer": None}  # the optimizer is never touched
    kept = copy.deepcopy(kept)  # its own tensors: loading the best overwrites the module's
    if isinstance(state, dict) and "module" in state:
        state = {"module": state["module"], "optimizer": None}  # the weights alone
    model.load_state_dict(state)
    return kept
