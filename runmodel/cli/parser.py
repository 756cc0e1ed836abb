"""The ``runmodel`` command's parser: one function per subcommand, each naming its handler
(``set_defaults(func=...)``, in ``commands.py``). Nothing here imports torch."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

from .. import __version__
from ..core.phases import MODES
from ..runs import plot as plotting  # its module imports only the standard library
from ..session.interrupt import signal_number
from . import commands, launch

if TYPE_CHECKING:
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["parser"]


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="runmodel",
        description="Run PyTorch models through runmodel's hook-driven engine.",
        epilog="SOURCE is path/file.py, path/file.py:ClassName or package.module:ClassName; a .py "
        "file that defines no Model subclass is a script (docs/runs.md); a .toml or .json file "
        "is a config (docs/config.md).",
    )
    made.add_argument("--version", action="version", version=f"runmodel {__version__}")
    subcommands = made.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (
        _run,
        _benchmark,
        _profile,
        _describe,
        _lr_find,
        _runs,
        _resume,
        _eval,
        _infer,
        _export,
        _sweep,
        _plot,
        _check_resume,
    ):
        add(subcommands)
    return made


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _signal(text: str) -> int:
    """A signal that can preempt a run: a name (SIGUSR1, USR1) or a number."""
    try:
        found = signal_number(int(text) if text.isdigit() else text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if found in (signal.SIGKILL, signal.SIGSTOP):
        raise argparse.ArgumentTypeError(
            f"{found.name} cannot be caught: nothing can save before it ends the process"
        )
    if found == signal.SIGINT:
        raise argparse.ArgumentTypeError("SIGINT (Ctrl-C) interrupts every run already")
    return int(found)


def _preemption(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--preempt-signal",
        dest="preempt_signals",
        action="append",
        type=_signal,
        default=[],
        metavar="SIG",
        help="a signal that preempts the run as SIGTERM does (repeatable): it "
        "stops after its step, saves and exits 128 + the signal's number; "
        "SIGUSR1 is what SLURM's --signal sends (docs/preemption.md)",
    )


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give column names, as in --columns run,status,lr")
    return names


def _subcommand(
    subcommands: Subcommands,
    name: str,
    text: str,
    handler: Callable[[argparse.Namespace], int],
    description: str | None = None,
) -> argparse.ArgumentParser:
    sub = subcommands.add_parser(name, help=text, description=description or text)
    sub.set_defaults(func=handler)
    return sub


def _on_a_source(
    subcommands: Subcommands, name: str, text: str, handler: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """A subcommand on a SOURCE (a model, a script, a config), with the options every
    such subcommand takes."""
    sub = _subcommand(subcommands, name, text, handler)
    sub.add_argument("source", metavar="SOURCE", help="the model to load, a script or a config")
    sub.add_argument("--device", help="cpu, cuda, cuda:N, mps (default: the model's choice)")
    sub.add_argument(
        "--set",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an init or setup option (repeatable); KEY may "
        "be init.NAME or setup.NAME, or a config's dotted key; VALUE is a Python "
        "literal or a string",
    )
    sub.add_argument("--debug", action="store_true", help="show full tracebacks")
    if name not in ("describe", "lr-find"):
        sub.add_argument(
            "--timer",
            action="store_true",
            help="time each phase and hook (the Timer pack) and print it",
        )
    return sub


def _json(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--json", action="store_true", help="print the result as JSON")


def _debug(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--debug", action="store_true", help="show full tracebacks")


def _run(subcommands: Subcommands) -> None:
    run = _on_a_source(
        subcommands,
        "run",
        "run a model, or a config file (.toml/.json), and print its result",
        commands.run,
    )
    run.add_argument("--mode", choices=MODES, help="default: train (or the config's)")
    run.add_argument("--epochs", type=_count, help="number of epochs")
    run.add_argument("--steps", type=_count, help="step budget")
    run.add_argument(
        "--iterations",
        type=_count,
        help="budget in iterations (optimizer steps), instead of --steps",
    )
    _json(run)
    run.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bar (or line per epoch) while training",
    )
    run.add_argument(
        "--seed",
        type=_count,
        help="seed Python's, torch's and numpy's "
        "generators first (default: a config's seed; 0 for a model source's "
        "train run)",
    )
    run.add_argument(
        "--runs-dir",
        default="runs",
        help="where the run folders of configs and of model sources' train runs go (default: runs)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="a config or model source whose run exists: continue it from its newest checkpoint",
    )
    run.add_argument(
        "--restart",
        action="store_true",
        help="a config or model source whose run exists: move that run aside and start again",
    )
    _preemption(run)
    run.add_argument(
        "--backend",
        choices=("ddp", "fsdp"),
        help="with --nproc-per-node: ddp (default) or fsdp (sharded parameters, "
        "gradients and optimizer state); a config's own ddp or fsdp backend "
        "wins, and another --backend is an error",
    )
    launch.add_arguments(run)


def _timed(subcommands: Subcommands, name: str, text: str) -> argparse.ArgumentParser:
    timed = _on_a_source(subcommands, name, text, commands.measure)
    timed.add_argument(
        "--steps", type=_count, help="steps, warm-up included (default: warm-up + 50)"
    )
    timed.add_argument("--warmup", type=_count, default=5, help="steps not measured")
    timed.add_argument(
        "--measure", choices=("train", "infer"), default="train", help="which step to time"
    )
    _json(timed)
    return timed


def _benchmark(subcommands: Subcommands) -> None:
    _timed(subcommands, "benchmark", "time a model's steps (warm-up dropped)")


def _profile(subcommands: Subcommands) -> None:
    profile = _timed(subcommands, "profile", "profile a model's steps with torch.profiler")
    profile.add_argument("--dir", help="where the trace goes (default: runs/profile-...)")


def _describe(subcommands: Subcommands) -> None:
    _on_a_source(
        subcommands,
        "describe",
        "show a model and the resolved phase and hook table",
        commands.describe,
    )


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} is not above 0")
    return value


def _lr_find(subcommands: Subcommands) -> None:
    find = _on_a_source(
        subcommands,
        "lr-find",
        "find a learning rate: the range test (the "
        "rate raised step by step until the loss diverges), the model left as "
        "it was",
        commands.lr_find,
    )
    find.add_argument("--start-lr", type=_rate, default=1e-7, help="default: 1e-7")
    find.add_argument("--end-lr", type=_rate, default=10.0, help="default: 10")
    find.add_argument(
        "--steps",
        type=_count,
        default=100,
        help="steps at most, the rate raised exponentially over them (default: 100)",
    )
    find.add_argument(
        "-o",
        "--output",
        default="lr_find.png",
        help="the PNG of the loss against the learning rate (default: lr_find.png)",
    )
    _json(find)


def _runs(subcommands: Subcommands) -> None:
    runs = _subcommand(
        subcommands,
        "runs",
        "list runs: what differs, metrics, status",
        commands.runs,
        "list the runs under DIR (of configs, model sources and "
        "scripts): "
        "status, the config values that differ, steps and final metrics; wide "
        "columns are folded to the terminal's width",
    )
    runs.add_argument("dir", nargs="?", default="runs", help="default: runs")
    runs.add_argument(
        "--columns",
        type=_names,
        metavar="NAME,NAME",
        help="the columns to show, in this order: run, status, steps, a config "
        "key (or its last parts, as lr for optimizer.args.lr) or a metric",
    )
    _debug(runs)


def _resume(subcommands: Subcommands) -> None:
    resume = _subcommand(
        subcommands,
        "resume",
        "continue a run from its checkpoint",
        commands.resume,
        "continue a run (of a config, a model source or a "
        "script) from its newest checkpoint; --epochs/--steps/--iterations extend it",
    )
    resume.add_argument("run_dir", metavar="RUN_DIR")
    resume.add_argument(
        "--epochs",
        type=_count,
        help="the run's length in epochs, from its start (more than it has: an extension)",
    )
    length = resume.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_count, help="the run's step budget, from its start")
    length.add_argument(
        "--iterations",
        type=_count,
        help="the run's budget in iterations (optimizer steps), from its start, instead of --steps",
    )
    _json(resume)
    resume.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bar (or line per epoch)",
    )
    _preemption(resume)
    _debug(resume)
    launch.add_arguments(
        resume,
        "a config run that ran in several processes starts again in "
        "as many (recorded in its folder); these options must agree with that",
    )


def _trained(subcommands: Subcommands, name: str, text: str) -> argparse.ArgumentParser:
    trained = _subcommand(
        subcommands,
        name,
        text,
        commands.evaluate,
        text + ": its best checkpoint, else its last, else its final weights",
    )
    trained.add_argument("run_dir", metavar="RUN_DIR")
    trained.add_argument(
        "--checkpoint",
        metavar="best|last|FILE",
        help="the weights to use (default: best, else last, else the final model.pt)",
    )
    trained.add_argument(
        "--averaged",
        action="store_true",
        help="the averaged weights an EMA or SWA pack kept in the checkpoint",
    )
    trained.add_argument(
        "--split",
        choices=("eval", "test"),
        default="eval",
        help="the data: the model's eval_data (default) or its test_data (metrics named test_*)",
    )
    _json(trained)
    _debug(trained)
    return trained


def _eval(subcommands: Subcommands) -> None:
    _trained(subcommands, "eval", "evaluate a trained run on its eval data")


def _infer(subcommands: Subcommands) -> None:
    infer = _trained(subcommands, "infer", "infer with a trained run and save its outputs")
    infer.add_argument(
        "--output", "-o", metavar="FILE.pt", required=True, help="where the outputs go (torch.save)"
    )


def _export(subcommands: Subcommands) -> None:
    export = _subcommand(
        subcommands,
        "export",
        "write a checkpoint's model weights as one plain state dict "
        "file, or a run's model as a torch.export or ONNX program",
        commands.export,
        "write the full model state dict of a checkpoint (a file, a sharded checkpoint "
        "folder, a Checkpoint pack's folder: its newest readable checkpoint; a run folder: "
        "its best, else its last, as eval takes) to OUT, one torch.save file that "
        "torch.load(weights_only=True) loads into the bare module; or, with --format pt2 "
        "or onnx, a run folder's module with its best (else last, else final) weights as "
        "a program, checked against the module on a batch of the run's data",
    )
    export.add_argument("path", metavar="PATH")
    export.add_argument("out", metavar="OUT")
    export.add_argument(
        "--format",
        choices=("state_dict", "pt2", "onnx", "hf"),
        default="state_dict",
        help="state_dict (default, any checkpoint); pt2 (torch.export) or "
        "onnx (torch.onnx, dynamo; pip install 'runmodel[onnx]'), from a run "
        "folder, with a dynamic batch dimension; hf: a Hugging Face model's "
        "save_pretrained folder OUT (weights and config) that from_pretrained loads",
    )
    export.add_argument(
        "--averaged",
        action="store_true",
        help="the averaged weights an EMA or SWA pack kept in the checkpoint",
    )
    export.add_argument(
        "--checkpoint",
        metavar="best|last|FILE",
        help="from a run folder: the run's weights to use (default, as for eval: "
        "best, else last, else the final model.pt)",
    )
    _debug(export)


def _sweep(subcommands: Subcommands) -> None:
    sweep = _subcommand(
        subcommands,
        "sweep",
        "search a config's values over many runs (on Optuna)",
        commands.sweep,
        "search a config's values over many config runs, pruning the "
        "hopeless ones (on Optuna); the same command again continues the sweep",
    )
    sweep.add_argument(
        "source",
        metavar="CONFIG",
        help="a config file; its [sweep] table says what to search (the options below override it)",
    )
    sweep.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="KEY=SPACE",
        help="a config key and its space, as in "
        "--param 'model.args.hidden={choice = [32, 64]}' (repeatable); spaces: "
        "uniform, log_uniform, int, choice",
    )
    sweep.add_argument("--trials", type=_count, help="finished trials wanted (default 10)")
    sweep.add_argument("--metric", help="the metric to optimize, as in eval_accuracy")
    sweep.add_argument("--direction", choices=("max", "min"), help="default: max")
    sweep.add_argument("--sampler", help="tpe (default) or random")
    sweep.add_argument(
        "--pruner", help="median (default), percentile, hyperband, successive_halving or none"
    )
    sweep.add_argument("--seed", type=int, help="the sampler's seed (default: the config's)")
    sweep.add_argument(
        "--storage",
        help="an Optuna storage URL shared by several machines "
        "(default: a journal file in the sweep's folder)",
    )
    sweep.add_argument(
        "--jobs",
        type=_count,
        default=1,
        help="trials at a time, each in its own process (default 1)",
    )
    sweep.add_argument(
        "--nproc-per-node",
        type=_count,
        metavar="N",
        help="each trial a run in N processes on this machine (torchrun; the "
        "ddp backend, or the config's own ddp or fsdp); default: one process",
    )
    sweep.add_argument("--runs-dir", default="runs", help="the sweep's folder goes here")
    sweep.add_argument(
        "--heartbeat",
        type=_count,
        metavar="SECONDS",
        help="seconds between "
        "a running trial's heartbeats in a database storage (default: the "
        "config's [sweep] heartbeat, else 60)",
    )
    sweep.add_argument(
        "--set",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config value for every trial (repeatable)",
    )
    _debug(sweep)


def _plot(subcommands: Subcommands) -> None:
    plot = _subcommand(
        subcommands,
        "plot",
        "plot config runs' loss and metric curves (PNG)",
        commands.plot,
        "plot the loss and metric curves of runs into one PNG",
    )
    plotting.add_arguments(plot)


def _check_resume(subcommands: Subcommands) -> None:
    check = _subcommand(
        subcommands,
        "check-resume",
        "check that a run of a model resumes exactly after a kill",
        commands.check_resume,
        "train the run K steps straight; train it again, save at step "
        "S, SIGKILL it in step S+1 and resume it, each in its own process; compare weights, "
        "optimizer state and random generators bit for bit, name the first tensor and the "
        "first step that differ, and the first module whose output differs in that step "
        "(docs/check_resume.md). Exit 0 when the resume is exact, 1 when it is not",
    )
    check.add_argument("source", metavar="SOURCE", help="the model to load, a config or a script")
    check.add_argument(
        "--steps",
        type=_count,
        metavar="K",
        help="steps of each run (default 20; more than an epoch checks an epoch's end too)",
    )
    check.add_argument(
        "--at",
        type=_count,
        metavar="S",
        help="save at step S (default: one "
        "mid-epoch, in an epoch after the first where the run has one, near "
        "the middle)",
    )
    check.add_argument(
        "--nproc-per-node",
        type=_count,
        metavar="N",
        help="each run in N processes (torchrun), with the ddp backend (or "
        "--backend, or a config's own)",
    )
    check.add_argument(
        "--backend", choices=("ddp", "fsdp"), help="with --nproc-per-node: ddp (default) or fsdp"
    )
    check.add_argument(
        "--dir",
        help="keep the runs' folders, records and logs here (a new or "
        "empty folder; default: a temporary one, removed after)",
    )
    check.add_argument("--device", help="cpu, cuda, cuda:N, mps (default: the model's choice)")
    check.add_argument(
        "--set",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an init or setup option (repeatable), or a "
        "config's dotted key, as for `runmodel run`",
    )
    _debug(check)
