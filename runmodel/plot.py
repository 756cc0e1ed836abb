"""``runmodel.plot``: the loss and metric curves of runs (``runmodel.runs.plot``)."""

from .runs.plot import (
    Curve,
    Run,
    add_arguments,
    event_folders,
    figure,
    labels,
    load_runs,
    main,
    plot,
    read_curves,
    sweep_figure,
)

__all__ = [
    "Curve",
    "Run",
    "add_arguments",
    "event_folders",
    "figure",
    "labels",
    "load_runs",
    "main",
    "plot",
    "read_curves",
    "sweep_figure",
]

if __name__ == "__main__":  # python -m runmodel.plot RUN_DIR...
    import sys

    from .runs.plot import command

    sys.exit(command())
