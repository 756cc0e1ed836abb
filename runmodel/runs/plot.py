"""``runmodel plot RUN_DIR...``: the loss and metric curves of config runs, one PNG.

    runmodel plot runs/digits-* -o digits.png
    runmodel plot runs/a runs/b --metrics loss,eval_accuracy
    runmodel plot runs/my_sweep -o sweep.png     # a sweep: its metric by each parameter

One panel per quantity, one line per run, against the global step. The curves are what
each run's TensorBoard pack wrote to ``RUN_DIR/tensorboard`` (every config run has one):
at each epoch's end the loss, every metric and the learning rates (``lr/groupN``; plotted
when asked for by ``--metrics``), and the loss every N steps where the pack was given
``every_steps=N`` (``train/loss_step``). A resumed run's repeated steps count once (the
newest value). Each run is labelled by the config values that differ between the runs
(``lr=0.01, hidden=256``), or by its folder's name when none do.

matplotlib is an optional dependency (``pip install 'runmodel[plot]'``); it and
TensorBoard's reader are imported only when a plot is made.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..extras import require

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Curve", "Run", "add_arguments", "command", "figure", "labels", "load_runs", "main",
           "plot", "read_curves"]

EXIT_OK, EXIT_USAGE = 0, 2
#: Inches per panel (width, height) and pixels per inch: a PNG's size follows from these.
PANEL, DPI, COLUMNS = (5.0, 3.5), 100, 2


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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _not_a_run(path: Path) -> str:
    """Why ``path`` is no run directory, naming what is there instead."""
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is a file, not a run directory"
    runs = sorted({p.parent.name for name in ("config.json", "run.json")
                   for p in path.glob(f"*/{name}")})
    if runs:
        return (f"{path} is not a run directory but holds {len(runs)} runs: give them, as in "
                f"`runmodel plot {path / '*'}` ({', '.join(runs[:5])}"
                + (", ..." if len(runs) > 5 else "") + ")")
    found = sorted(p.name for p in path.iterdir())
    return (f"{path} is not a run directory (no config.json or run.json; it holds "
            + (", ".join(found[:8]) + (", ..." if len(found) > 8 else "") if found
               else "nothing") + ")")


def _script_run(path: Path) -> dict[str, Any]:
    """A script run (``engine.run(..., run_dir=)``) as plot labels it: script, arguments,
    length."""
    record = _read_json(path / "run.json")
    if not record:
        return {}
    return {"script": Path(str(record.get("script"))).name,
            "args": " ".join(map(str, record.get("argv") or [])),
            "epochs": record.get("epochs"), "steps": record.get("steps")}


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
        config = _read_json(path / "config.json") or _script_run(path)
        if not config:
            if len(given_all) == 1:
                raise ValueError(_not_a_run(path))
            # several folders (a glob such as runs/*): the ones that are no runs (a
            # profile's trace folder...) are skipped, each said in one line
            print(f"runmodel plot: skipping {path}: not a run folder", file=sys.stderr)
            continue
        events = path / "tensorboard"
        if not any(events.glob("*tfevents*")):
            raise ValueError(f"{path} has no TensorBoard events in {events} (a config run "
                             f"writes them from its first epoch's end)")
        runs.append(Run(path, config, read_curves(events)))
    if not runs:
        raise ValueError("give at least one run directory" + (
            f" (none of the {len(given_all)} folders given is one)" if given_all else ""))
    return runs


def _flatten(data: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(data, dict):
        flat: dict[str, str] = {}
        for key, value in data.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: data if isinstance(data, str) else json.dumps(data)}


def _short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted key by its shortest ending that no other key shares
    (``optimizer.args.lr`` -> ``lr``)."""
    names = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[-n:])
            if not any(other != key and (other == name or other.endswith("." + name))
                       for other in keys):
                break
        names[key] = name
    return names


def labels(configs: Sequence[dict[str, Any]], names: Sequence[str]) -> list[str]:
    """A label per run: the config values that differ between the runs
    (``lr=0.01, hidden=256``), or the run's name (``names``) where that leaves runs alike."""
    flats = [_flatten(config) for config in configs]
    keys = sorted({key for flat in flats for key in flat})
    differing = [k for k in keys if len({flat.get(k) for flat in flats}) > 1]
    short = _short_names(differing)
    made = [", ".join(f"{short[k]}={flat.get(k, '-')}" for k in differing) for flat in flats]
    return [name if not label or made.count(label) > 1 else label
            for label, name in zip(made, names, strict=True)]


def _matches(tag: str, name: str) -> bool:
    return tag == name or tag.partition("/")[2] == name


def _rank(tag: str) -> int:
    """Where a tag goes: the loss, the other losses (per step), metrics, learning rates
    (a stable sort keeps the order the runs logged them in otherwise)."""
    name = tag.partition("/")[2]
    return 0 if name == "loss" else 1 if name.startswith("loss") else 3 if (
        tag.startswith("lr/")) else 2


def _chosen(runs: Sequence[Run], metrics: Sequence[str] | None) -> list[str]:
    """The tags to plot: those ``metrics`` name (a tag, or a tag without its ``train/``
    part), else every tag but the learning rates; the losses first."""
    tags = sorted(dict.fromkeys(tag for run in runs for tag in run.curves), key=_rank)
    if metrics:
        unknown = [name for name in metrics if not any(_matches(t, name) for t in tags)]
        if unknown:
            raise ValueError(f"no run has {', '.join(map(repr, unknown))}; the runs have "
                             + (", ".join(tags) or "no curves"))
        return [tag for name in metrics for tag in tags if _matches(tag, name)]
    chosen = [tag for tag in tags if not tag.startswith("lr/")]
    if not chosen:
        raise ValueError("the runs have no loss or metric curves yet"
                         + (f" (only {', '.join(tags)})" if tags else ""))
    return chosen


def figure(run_dirs: Iterable[str | Path], metrics: Sequence[str] | None = None) -> Figure:
    """The figure ``plot`` saves: one panel (axes) per quantity, titled by its tag, one
    line per run that logged it, labelled as ``labels`` says."""
    require("matplotlib", needed_by="runmodel plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = load_runs(run_dirs)
    tags = _chosen(runs, metrics)
    names = labels([run.config for run in runs], [run.path.name for run in runs])
    columns = min(COLUMNS, len(tags))
    rows = -(-len(tags) // columns)
    # no pyplot: no global figure list to leak into, and Agg draws the PNG whatever the
    # machine's display
    fig = Figure(figsize=(PANEL[0] * columns, PANEL[1] * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    for i, tag in enumerate(tags):
        axes = fig.add_subplot(rows, columns, i + 1)
        for run, name in zip(runs, names, strict=True):
            curve = run.curves.get(tag)
            if curve is not None:
                axes.plot(curve.steps, curve.values, label=name,
                          marker="o" if len(curve.steps) <= 30 else None, markersize=3)
        axes.set_title(tag)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        if len(runs) > 1:
            axes.legend(fontsize="small")
    return fig


def plot(run_dirs: Iterable[str | Path], output: str | Path,
         metrics: Sequence[str] | None = None) -> Path:
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
    parameter, one point per finished trial (a log axis for a ``log_uniform`` space), and
    the best value so far by trial, in the order the trials started."""
    require("matplotlib", needed_by="runmodel plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    folder = Path(folder)
    sweep = _read_json(folder / "sweep.json")
    metric, params = sweep.get("metric"), sweep.get("params") or {}
    trials = []
    for config_file in folder.glob("*/config.json"):
        value = _read_json(config_file.parent / "metrics.json").get("metrics", {}).get(metric)
        if isinstance(value, (int, float)):
            started = _read_json(config_file.parent / "status.json").get("started", 0)
            trials.append((started, _flatten(_read_json(config_file)), float(value)))
    if not trials:
        raise ValueError(f"{folder}: the sweep has no finished trial with {metric!r} yet")
    trials.sort(key=lambda t: t[0])
    panels = [*params, "best so far"]
    columns = min(COLUMNS, len(panels))
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(PANEL[0] * columns, PANEL[1] * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    values = [value for _, _, value in trials]
    for i, key in enumerate(params):
        axes = fig.add_subplot(rows, columns, i + 1)
        xs: list[Any] = [json.loads(flat[key]) if key in flat else None for _, flat, _ in trials]
        axes.scatter([str(x) for x in xs] if "choice" in params[key] else xs, values)
        if "log_uniform" in params[key]:
            axes.set_xscale("log")
        axes.set(title=f"{metric} by {key}", xlabel=key, ylabel=metric)
        axes.grid(alpha=0.3)
    pick = max if sweep.get("direction", "max") == "max" else min
    best = [pick(values[:n + 1]) for n in range(len(values))]
    axes = fig.add_subplot(rows, columns, len(panels))
    axes.plot(range(1, len(best) + 1), best, marker="o", markersize=3, label="best so far")
    axes.scatter(range(1, len(values) + 1), values, s=9, alpha=0.5, label="trial")
    axes.set(title=f"best {metric} so far", xlabel="trials finished", ylabel=metric)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return fig


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give metric names, as in --metrics loss,eval_accuracy")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``runmodel plot`` (the command's parser, or this module's own)."""
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="config run directories")
    parser.add_argument("-o", "--output", default="plot.png",
                        help="the PNG to write (default: plot.png)")
    parser.add_argument("--metrics", type=_names, metavar="NAME,NAME",
                        help="the quantities to plot, by TensorBoard tag or name (loss, "
                        "eval_accuracy, lr/group0); default: the loss and every metric")
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
    parser = argparse.ArgumentParser(prog="runmodel plot", description=(
        "plot the loss and metric curves of config runs into one PNG"))
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(command())
