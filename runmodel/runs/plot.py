"""``runmodel plot RUN_DIR...``: the loss and metric curves of runs, one PNG.

    runmodel plot runs/digits-* -o digits.png
    runmodel plot runs/a runs/b --metrics loss,eval_accuracy
    runmodel plot runs/my_sweep -o sweep.png     # a sweep: its metric by each parameter

One panel per quantity, against the global step: the training and the evaluation values
of one quantity share its panel (``train/loss`` and ``train/eval_loss`` are the panel
``loss``, a solid and a dashed line), one colour per run. The curves are what each run's
TensorBoard pack wrote, wherever it wrote them (the folders the run's record names,
``run.json``'s ``"tensorboard"``; else ``RUN_DIR/tensorboard``, which every config run has;
else any folder of the run holding event files): at each epoch's end the loss, every metric
and the learning rates (``lr/groupN``; plotted when asked for by ``--metrics``), and the
loss every N steps where the pack was given ``every_steps=N`` (``train/loss_step``). A
resumed run's repeated steps count once (the newest value). Each run is labelled by the
config values that differ between the runs (``lr=0.01, hidden=256``), or by its folder's
name when none do.

Run folders are read through the readers ``runmodel runs`` uses (``runs/table.py``).
matplotlib is an optional dependency (``pip install 'runmodel[plot]'``); it and
TensorBoard's reader are imported only when a plot is made.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import read_json
from ..extras import require
from ..session.folder import CONFIG, METRICS, RECORD, STATUS, is_run
from .table import described, flatten, short_names

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "Curve",
    "Run",
    "add_arguments",
    "command",
    "event_folders",
    "figure",
    "labels",
    "load_runs",
    "main",
    "plot",
    "read_curves",
    "sweep_figure",
]

EXIT_OK, EXIT_USAGE = 0, 2
#: Inches per panel (width, height) and pixels per inch: a PNG's size follows from these.
PANEL, DPI, COLUMNS = (5.0, 3.5), 100, 2
#: How each kind of value of a quantity is drawn: the training values solid, evaluations
#: dashed, a test split's dotted.
STYLES = {"train": "-", "eval": "--", "test": ":"}


@dataclass(frozen=True, slots=True)
class Curve:
    """One quantity of one run: the global steps and the values logged at them."""

    steps: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Run:
    """A run directory read back: its config and its curves by TensorBoard tag."""

    path: Path
    config: dict[str, Any]
    curves: dict[str, Curve]


def _not_a_run(path: Path) -> str:
    """Why ``path`` is no run directory, naming what is there instead."""
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is a file, not a run directory"
    runs = sorted(child.name for child in path.iterdir() if child.is_dir() and is_run(child))
    if runs:
        return (
            f"{path} is not a run directory but holds {len(runs)} runs: give them, as in "
            f"`runmodel plot {path / '*'}` ({', '.join(runs[:5])}"
            + (", ..." if len(runs) > 5 else "")
            + ")"
        )
    found = sorted(p.name for p in path.iterdir())
    return (
        f"{path} is not a run directory (no config.json or run.json; it holds "
        + (", ".join(found[:8]) + (", ..." if len(found) > 8 else "") if found else "nothing")
        + ")"
    )


def event_folders(run_dir: str | Path) -> list[Path]:
    """Where the run in ``run_dir`` has its TensorBoard events: the folders its record
    names (``run.json``'s ``"tensorboard"``: a path, or a list of them, each relative to
    the run folder or absolute), else its ``tensorboard/`` folder, else every folder in
    it that holds event files. Only folders that hold event files."""
    run_dir = Path(run_dir)
    named = read_json(run_dir / RECORD).get("tensorboard") or []
    for candidates in (
        [run_dir / str(p) for p in ([named] if isinstance(named, str) else named)],
        [run_dir / "tensorboard"],
    ):
        found = [folder for folder in candidates if _has_events(folder)]
        if found:
            return found
    return sorted({event.parent for event in run_dir.rglob("*tfevents*")})


def _has_events(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("*tfevents*"))


def read_curves(directory: str | Path) -> dict[str, Curve]:
    """Every scalar in the TensorBoard event files under ``directory``, by tag. Steps are
    sorted; a step logged twice (a run resumed from before its last log) keeps the newest
    value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})  # keep all
    accumulator.Reload()
    curves = {}
    for tag in accumulator.Tags()["scalars"]:
        newest: dict[int, tuple[float, float]] = {}
        for event in accumulator.Scalars(tag):
            if event.step not in newest or event.wall_time >= newest[event.step][0]:
                newest[event.step] = (event.wall_time, event.value)
        steps = tuple(sorted(newest))
        curves[tag] = Curve(steps, tuple(newest[s][1] for s in steps))
    return curves


def load_runs(run_dirs: Iterable[str | Path]) -> list[Run]:
    """Read each run directory (given twice counts once); a folder that is no run
    directory, or a run with no TensorBoard events, is a ``ValueError`` naming what is
    there."""
    runs: list[Run] = []
    seen: set[Path] = set()
    given_all = [Path(given) for given in run_dirs]
    for path in given_all:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        if not is_run(path):
            if len(given_all) == 1:
                raise ValueError(_not_a_run(path))
            # several folders (a glob such as runs/*): the ones that are no runs (a
            # profile's trace folder...) are skipped, each said in one line
            print(f"runmodel plot: skipping {path}: not a run folder", file=sys.stderr)
            continue
        folders = event_folders(path)
        if not folders:
            raise ValueError(
                f"{path} has no TensorBoard events in {path / 'tensorboard'} "
                f"(a config run writes them from its first epoch's end)"
            )
        curves: dict[str, Curve] = {}
        for folder in folders:
            curves.update(read_curves(folder))
        runs.append(Run(path, described(path), curves))
    if not runs:
        raise ValueError(
            "give at least one run directory"
            + (f" (none of the {len(given_all)} folders given is one)" if given_all else "")
        )
    return runs


def labels(configs: Sequence[dict[str, Any]], names: Sequence[str]) -> list[str]:
    """A label per run: the config values that differ between the runs
    (``lr=0.01, hidden=256``), or the run's name (``names``) where that leaves runs alike."""
    flats = [flatten(config) for config in configs]
    keys = sorted({key for flat in flats for key in flat})
    differing = [k for k in keys if len({repr(flat.get(k)) for flat in flats}) > 1]
    short = short_names(differing)
    made = [", ".join(f"{short[k]}={flat.get(k, '-')}" for k in differing) for flat in flats]
    return [
        name if not label or made.count(label) > 1 else label
        for label, name in zip(made, names, strict=True)
    ]


def _matches(tag: str, name: str) -> bool:
    return tag == name or tag.partition("/")[2] == name


def quantity(tag: str) -> tuple[str, str]:
    """The panel a tag goes in and which of its values it is: ``train/loss`` is
    (``loss``, ``train``), ``train/eval_loss`` (``loss``, ``eval``), ``eval/accuracy`` (an
    eval run's) (``accuracy``, ``eval``); the learning rates keep their tag."""
    group, _, name = tag.rpartition("/")
    if group == "lr" or not group:
        return tag, ""
    for kind in ("eval", "test"):
        if name.startswith(kind + "_"):
            return name[len(kind) + 1 :], kind
    return name, group


def _rank(tag: str) -> int:
    """Where a tag goes: the loss, the other losses (per step), metrics, learning rates
    (a stable sort keeps the order the runs logged them in otherwise)."""
    name = tag.partition("/")[2]
    return (
        0
        if name == "loss"
        else 1
        if name.startswith("loss")
        else 3
        if (tag.startswith("lr/"))
        else 2
    )


def _chosen(runs: Sequence[Run], metrics: Sequence[str] | None) -> list[str]:
    """The tags to plot: those ``metrics`` name (a tag, or a tag without its ``train/``
    part), else every tag but the learning rates; the losses first."""
    tags = sorted(dict.fromkeys(tag for run in runs for tag in run.curves), key=_rank)
    if metrics:
        unknown = [name for name in metrics if not any(_matches(t, name) for t in tags)]
        if unknown:
            raise ValueError(
                f"no run has {', '.join(map(repr, unknown))}; the runs have "
                + (", ".join(tags) or "no curves")
            )
        return list(dict.fromkeys(tag for name in metrics for tag in tags if _matches(tag, name)))
    chosen = [tag for tag in tags if not tag.startswith("lr/")]
    if not chosen:
        raise ValueError(
            "the runs have no loss or metric curves yet"
            + (f" (only {', '.join(tags)})" if tags else "")
        )
    return chosen


def panels(tags: Sequence[str]) -> dict[str, list[str]]:
    """The chosen tags by panel (their quantity), in the order of their first tag."""
    found: dict[str, list[str]] = {}
    for tag in tags:
        found.setdefault(quantity(tag)[0], []).append(tag)
    return found


def _title(name: str) -> tuple[str, str]:
    """A panel's title and its y axis's label."""
    if name.startswith("lr/"):
        return f"learning rate, {name[3:]}", "learning rate"
    if name.endswith("_step"):
        return f"{name[:-5]} per step", name[:-5]
    return name, name


def _whole_steps(axes: Axes) -> None:
    """Ticks at whole numbers on the x axis: it counts steps (or trials)."""
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))


def figure(run_dirs: Iterable[str | Path], metrics: Sequence[str] | None = None) -> Figure:
    """The figure ``plot`` saves: one panel (axes) per quantity, titled by it and its y
    axis labelled by it, a line per run and kind of value (train solid, eval dashed; one
    colour per run), labelled as ``labels`` says."""
    require("matplotlib", needed_by="runmodel plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = load_runs(run_dirs)
    chosen = panels(_chosen(runs, metrics))
    names = labels([run.config for run in runs], [run.path.name for run in runs])
    columns = min(COLUMNS, len(chosen))
    rows = -(-len(chosen) // columns)
    # no pyplot: no global figure list to leak into, and Agg draws the PNG whatever the
    # machine's display
    fig = Figure(figsize=(PANEL[0] * columns, PANEL[1] * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    for i, (panel, tags) in enumerate(chosen.items()):
        axes = fig.add_subplot(rows, columns, i + 1)
        kinds = {quantity(tag)[1] for tag in tags}
        for colour, (run, name) in enumerate(zip(runs, names, strict=True)):
            for tag in tags:
                curve = run.curves.get(tag)
                if curve is None:
                    continue
                kind = quantity(tag)[1]
                label = name if len(kinds) == 1 else kind if len(runs) == 1 else f"{name} ({kind})"
                axes.plot(
                    curve.steps,
                    curve.values,
                    label=label,
                    color=f"C{colour % 10}",
                    linestyle=STYLES.get(kind, "-."),
                    marker="o" if len(curve.steps) <= 30 else None,
                    markersize=3,
                )
        title, ylabel = _title(panel)
        axes.set(title=title, xlabel="step", ylabel=ylabel)
        _whole_steps(axes)
        axes.grid(alpha=0.3)
        if len(axes.get_lines()) > 1:
            axes.legend(fontsize="small")
    return fig


def plot(
    run_dirs: Iterable[str | Path], output: str | Path, metrics: Sequence[str] | None = None
) -> Path:
    """Write the loss and metric curves of ``run_dirs`` to ``output`` (a PNG; ``.svg`` and
    ``.pdf`` work too; no suffix means ``.png``) and return its path."""
    path = Path(output)
    if not path.suffix:
        path = path.with_suffix(".png")
    run_dirs = list(run_dirs)
    sweeps = [Path(d) for d in run_dirs if (Path(d) / "sweep.json").is_file()]
    if sweeps and len(run_dirs) > 1:
        raise ValueError(f"{sweeps[0]} is a sweep's folder: plot it alone")
    fig = sweep_figure(sweeps[0]) if sweeps else figure(run_dirs, metrics)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def sweep_figure(folder: str | Path) -> Figure:
    """A sweep's figure (``runmodel plot SWEEP_DIR``): its metric against each swept
    parameter, one point per finished trial (a log axis for a ``log_uniform`` space, the
    choices of a ``choice`` space in their order, whole numbers for an ``int`` space), and
    the best value so far by trial, in the order the trials started."""
    require("matplotlib", needed_by="runmodel plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    folder = Path(folder)
    sweep = read_json(folder / "sweep.json")
    metric, params = sweep.get("metric"), sweep.get("params") or {}
    trials = []
    for trial in (path.parent for path in folder.glob(f"*/{CONFIG}")):
        value = read_json(trial / METRICS).get("metrics", {}).get(metric)
        if isinstance(value, (int, float)):
            started = read_json(trial / STATUS).get("started", 0)
            trials.append((started, flatten(described(trial)), float(value)))
    if not trials:
        raise ValueError(f"{folder}: the sweep has no finished trial with {metric!r} yet")
    trials.sort(key=lambda t: t[0])
    names = [*params, "best so far"]
    columns = min(COLUMNS, len(names))
    rows = -(-len(names) // columns)
    fig = Figure(figsize=(PANEL[0] * columns, PANEL[1] * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    values = [value for _, _, value in trials]
    for i, key in enumerate(params):
        axes = fig.add_subplot(rows, columns, i + 1)
        xs: list[Any] = [flat.get(key) for _, flat, _ in trials]
        if "choice" in params[key]:
            _categories(axes, xs, values)
        else:
            axes.scatter(xs, values)
        if "log_uniform" in params[key]:
            axes.set_xscale("log")
        if "int" in params[key]:
            _whole_steps(axes)
        axes.set(title=f"{metric} by {key}", xlabel=key, ylabel=metric)
        axes.grid(alpha=0.3)
    pick = max if sweep.get("direction", "max") == "max" else min
    best = [pick(values[: n + 1]) for n in range(len(values))]
    axes = fig.add_subplot(rows, columns, len(names))
    axes.plot(range(1, len(best) + 1), best, marker="o", markersize=3, label="best so far")
    axes.scatter(range(1, len(values) + 1), values, s=9, alpha=0.5, label="trial")
    axes.set(title=f"best {metric} so far", xlabel="trials finished", ylabel=metric)
    _whole_steps(axes)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return fig


def _categories(axes: Axes, xs: Sequence[Any], values: Sequence[float]) -> None:
    """A categorical axis in the categories' order (numbers by value), not in the order
    the trials happened to draw them."""
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    order = sorted(set(xs), key=lambda x: x if numeric else str(x))
    axes.scatter([order.index(x) for x in xs], values)
    axes.set_xticks(range(len(order)), [str(x) for x in order])


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give metric names, as in --metrics loss,eval_accuracy")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``runmodel plot`` (the command's parser, or this module's own)."""
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders (config or script runs), or one sweep's folder",
    )
    parser.add_argument(
        "-o", "--output", default="plot.png", help="the PNG to write (default: plot.png)"
    )
    parser.add_argument(
        "--metrics",
        type=_names,
        metavar="NAME,NAME",
        help="the quantities to plot, by TensorBoard tag or name (loss, "
        "eval_accuracy, lr/group0); default: the loss and every metric",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")


def main(args: argparse.Namespace) -> int:
    """Run ``runmodel plot`` with parsed ``args``: print the path written and return 0, or
    print a one-line error and return 2."""
    try:
        path = plot(args.run_dirs, args.output, args.metrics)
    except (ValueError, OSError, ImportError) as error:
        if args.debug:
            traceback.print_exception(error)
        print(f"runmodel plot: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(path)
    return EXIT_OK


def command(argv: Sequence[str] | None = None) -> int:
    """``python -m runmodel.plot RUN_DIR...``: ``runmodel plot`` on its own."""
    parser = argparse.ArgumentParser(
        prog="runmodel plot", description=("plot the loss and metric curves of runs into one PNG")
    )
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(command())
