"""``runmodel.Engine``: the core engine (``runmodel.core``) with what needs the layers
above it: modes and backends given by name, a model's declared setup options checked
before anything runs, and ``engine.ignite``, a pytorch-ignite view of the run."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from . import core
from .config.registry import Spec, make_backend
from .models import declared_options
from .modes import as_mode

if TYPE_CHECKING:
    import ignite.engine

__all__ = ["Engine"]


class Engine(core.Engine):
    """Owns the phases, their hooks and overrides, the run state and the run."""

    def __init__(self) -> None:
        super().__init__()
        self._ignite: Any = None

    def run(self, model: Any, mode: core.Mode | str = "train", *, steps: int | None = None,
            epochs: int | None = None, setup_options: dict[str, Any] | None = None,
            backend: core.Backend | Spec | str | dict[str, Any] | None = None,
            resume: str | os.PathLike[str] | None = None) -> core.RunResult:
        """Run ``model`` in ``mode`` (a name, or a mode object with its options such as
        ``runmodel.Benchmark(measure="infer")``) for at most ``steps`` steps and
        ``epochs`` epochs.

        Without either, the model's loop decides (``runstep.epochs()`` yields one epoch).
        ``steps``/``epochs`` count from the start of training, so a resumed run given the
        same numbers ends where one straight run would. ``backend`` (a ``Backend`` or a
        registered name; default plain) prepares model and optimizer after
        ``model.setup()``; ``resume`` is a checkpoint file or a folder of them.
        """
        mode = as_mode(mode)
        prepares = (make_backend(backend or "plain") if backend is None
                    or isinstance(backend, (str, Spec, dict)) else backend)
        if setup_options is not None or getattr(model, "setup_defaults", None):
            setup_options = declared_options(model, "setup", setup_options,
                                             getattr(model, "setup_defaults", {}))
        return super().run(model, mode, steps=steps, epochs=epochs,
                           setup_options=setup_options, backend=prepares, resume=resume)

    @property
    def ignite(self) -> ignite.engine.Engine:
        """A pytorch-ignite ``Engine`` that mirrors this engine's runs, built on first use,
        so that ignite's handlers and metrics attach to a runmodel run unchanged."""
        if self._ignite is None:
            from .integrations.ignite import IgniteView

            self._ignite = IgniteView(self)
        return self._ignite.engine
