"""``runmodel.plot``: the loss and metric curves of runs (``runmodel.runs.plot``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.exports import lazy_exports

__all__ = [
    "Curve",
    "Run",
    "event_folders",
    "figure",
    "labels",
    "load_runs",
    "plot",
    "read_curves",
    "sweep_figure",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    dict.fromkeys(
        (
            "Curve",
            "Run",
            "event_folders",
            "figure",
            "labels",
            "load_runs",
            "plot",
            "read_curves",
            "sweep_figure",
        ),
        "runmodel.runs.plot",
    ),
    # the command line's (``runmodel plot``), not a plotting function
    deprecated={
        "add_arguments": "runmodel.runs.plot.add_arguments",
        "main": "runmodel.runs.plot.main",
    },
)

if TYPE_CHECKING:
    from .runs import plot as runs_plot
    from .runs.plot import (
        Curve,
        Run,
        event_folders,
        figure,
        labels,
        load_runs,
        plot,
        read_curves,
        sweep_figure,
    )

    # deprecated names (docs/changelog.md)
    add_arguments = runs_plot.add_arguments
    main = runs_plot.main

if __name__ == "__main__":  # python -m runmodel.plot RUN_DIR...
    import sys

    from .runs.plot import command

    sys.exit(command())
