"""The ``runmodel`` command: run, benchmark, profile and describe a model from source,
list and plot config runs.

``runmodel run SOURCE --nproc-per-node N`` (and torchrun's other options) hands the run to
torchrun (``launch.py``); each process it starts runs the command again with the ``ddp``
backend (or ``--backend fsdp``), and process rank 0 prints the result. A config run does
the same (``runs/torchrun.py``: rank 0 claims its folder and writes its files), and
``runmodel resume`` of it starts it again in as many processes as it ran in.

A model's file may define ``configure(engine)``; it is called with the run's engine before
the run (of a source, or of a config naming the model), to attach the hooks and packs that
the file's model wants.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..backends.distributed import env
from ..backends.distributed.failures import record_failure
from ..core.phases import MODES
from ..core.state import refused_at_setup
from ..runs import plot as plotting  # its module imports only the standard library
from . import launch

if TYPE_CHECKING:  # imported when a command needs them: --help stays fast
    from ..core import RunResult
    from ..engine import Engine
    from ..models import Model
    from ..runs import PreparedRun

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 141  # as a process that SIGPIPE ended


class UsageError(Exception):
    """Bad input found before the run started."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runmodel", description="Run PyTorch models through runmodel's hook-driven engine.",
        epilog="SOURCE is path/file.py, path/file.py:ClassName or package.module:ClassName; a .py "
        "file that defines no Model subclass is a script (docs/runs.md).")
    parser.add_argument("--version", action="version", version=f"runmodel {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("source", metavar="SOURCE", help="the model to load")
        sub.add_argument("--device", help="cpu, cuda, cuda:N, mps (default: the model's choice)")
        sub.add_argument("--set", dest="options", action="append", default=[],
                         metavar="KEY=VALUE", help="an init or setup option (repeatable); "
                         "KEY may be init.NAME or setup.NAME; VALUE is a Python literal "
                         "or a string")
        sub.add_argument("--debug", action="store_true", help="show full tracebacks")
        if name != "describe":
            sub.add_argument("--timer", action="store_true",
                             help="time each phase and hook (the Timer pack) and print it")
        return sub

    run = command("run", "run a model, or a config file (.toml/.json), and print its result")
    run.add_argument("--mode", choices=MODES, help="default: train (or the config's)")
    run.add_argument("--epochs", type=_count, help="number of epochs")
    run.add_argument("--steps", type=_count, help="step budget")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--no-progress", dest="progress", action="store_false",
                     help="no progress bar (or line per epoch) while training")
    run.add_argument("--runs-dir", default="runs", help="where config runs' directories go")
    run.add_argument("--resume", action="store_true",
                     help="a config whose run exists: continue it from its newest checkpoint")
    run.add_argument("--restart", action="store_true",
                     help="a config whose run exists: move that run aside and start again")
    run.add_argument("--backend", choices=("ddp", "fsdp"),
                     help="with --nproc-per-node: ddp (default) or fsdp (sharded parameters, "
                     "gradients and optimizer state); a config's own ddp or fsdp backend "
                     "wins, and another --backend is an error")
    launch.add_arguments(run)
    for name, text in (("benchmark", "time a model's steps (warm-up dropped)"),
                       ("profile", "profile a model's steps with torch.profiler")):
        timed = command(name, text)
        timed.add_argument("--steps", type=_count, help="steps, warm-up included "
                           "(default: warm-up + 50)")
        timed.add_argument("--warmup", type=_count, default=5, help="steps not measured")
        timed.add_argument("--measure", choices=("train", "infer"), default="train",
                           help="which step to time")
        timed.add_argument("--json", action="store_true", help="print the result as JSON")
        if name == "profile":
            timed.add_argument("--dir", help="where the trace goes (default: runs/profile-...)")
    command("describe", "show a model and the resolved phase and hook table")
    runs = commands.add_parser("runs", help="list config runs: what differs, metrics, status",
                               description="list config runs: what differs, metrics, status")
    runs.add_argument("dir", nargs="?", default="runs", help="default: runs")
    runs.add_argument("--debug", action="store_true", help="show full tracebacks")
    resume = commands.add_parser("resume", help="continue a run from its checkpoint",
                                 description="continue a run (config or script run) from its "
                                 "newest checkpoint; --epochs/--steps extend it")
    resume.add_argument("run_dir", metavar="RUN_DIR")
    resume.add_argument("--epochs", type=_count, help="the run's length in epochs, from its "
                        "start (more than it has: an extension)")
    resume.add_argument("--steps", type=_count, help="the run's step budget, from its start")
    resume.add_argument("--json", action="store_true", help="print the result as JSON")
    resume.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar (or line per epoch)")
    resume.add_argument("--debug", action="store_true", help="show full tracebacks")
    launch.add_arguments(resume, "a config run that ran in several processes starts again in "
                         "as many (recorded in its folder); these options must agree with that")
    for name, text in (("eval", "evaluate a trained run on its eval data"),
                       ("infer", "infer with a trained run and save its outputs")):
        trained = commands.add_parser(name, help=text, description=text + ": its best "
                                      "checkpoint, else its last, else its final weights")
        trained.add_argument("run_dir", metavar="RUN_DIR")
        trained.add_argument("--checkpoint", metavar="best|last|FILE",
                             help="the weights to use (default: best, else last, else the "
                             "final model.pt)")
        trained.add_argument("--json", action="store_true", help="print the result as JSON")
        trained.add_argument("--debug", action="store_true", help="show full tracebacks")
        if name == "infer":
            trained.add_argument("--output", "-o", metavar="FILE.pt", required=True,
                                 help="where the outputs go (torch.save)")
    export = commands.add_parser(
        "export", help="write a checkpoint's full model weights as one plain state dict file",
        description="write the full model state dict of a checkpoint (a file, a sharded "
        "checkpoint folder, a Checkpoint pack's folder or a run folder: its newest readable "
        "checkpoint) to OUT, one torch.save file that torch.load(weights_only=True) loads "
        "into the bare module")
    export.add_argument("path", metavar="PATH")
    export.add_argument("out", metavar="OUT")
    export.add_argument("--debug", action="store_true", help="show full tracebacks")
    sweep = commands.add_parser(
        "sweep", help="search a config's values over many runs (on Optuna)",
        description="search a config's values over many config runs, pruning the hopeless "
        "ones (on Optuna); the same command again continues the sweep")
    sweep.add_argument("source", metavar="CONFIG", help="a config file; its [sweep] table "
                       "says what to search (the options below override it)")
    sweep.add_argument("--param", dest="params", action="append", default=[],
                       metavar="KEY=SPACE", help="a config key and its space, as in "
                       "--param 'model.args.hidden={choice = [32, 64]}' (repeatable); spaces: "
                       "uniform, log_uniform, int, choice")
    sweep.add_argument("--trials", type=_count, help="finished trials wanted (default 10)")
    sweep.add_argument("--metric", help="the metric to optimize, as in eval_accuracy")
    sweep.add_argument("--direction", choices=("max", "min"), help="default: max")
    sweep.add_argument("--sampler", help="tpe (default) or random")
    sweep.add_argument("--pruner", help="median (default), percentile, hyperband, "
                       "successive_halving or none")
    sweep.add_argument("--seed", type=int, help="the sampler's seed (default: the config's)")
    sweep.add_argument("--storage", help="an Optuna storage URL shared by several machines "
                       "(default: a journal file in the sweep's folder)")
    sweep.add_argument("--jobs", type=_count, default=1, help="trials at a time, each in "
                       "its own process (default 1)")
    sweep.add_argument("--nproc-per-node", type=_count, metavar="N",
                       help="each trial a run in N processes on this machine (torchrun; the "
                       "ddp backend, or the config's own ddp or fsdp); default: one process")
    sweep.add_argument("--runs-dir", default="runs", help="the sweep's folder goes here")
    sweep.add_argument("--set", dest="options", action="append", default=[],
                       metavar="KEY=VALUE", help="a config value for every trial (repeatable)")
    sweep.add_argument("--debug", action="store_true", help="show full tracebacks")
    plot = commands.add_parser("plot", help="plot config runs' loss and metric curves (PNG)",
                               description="plot the loss and metric curves of config runs "
                               "into one PNG")
    plotting.add_arguments(plot)
    return parser


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _options(pairs: Sequence[str], cls: type[Model]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``--set`` pairs into init and setup options."""
    init: dict[str, Any] = {}
    setup: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {pair!r}: write KEY=VALUE, as in --set lr=0.01")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        scope, _, name = key.rpartition(".")
        if scope not in ("", "init", "setup"):
            raise UsageError(f"--set {pair!r}: the key is NAME, init.NAME or setup.NAME")
        if not scope:
            scope = "init" if name in getattr(cls, "init_defaults", {}) else "setup"
        (init if scope == "init" else setup)[name] = value
    return init, setup


def _load(args: argparse.Namespace) -> tuple[Model, Engine, dict[str, Any]]:
    from ..engine import Engine
    from ..models import configure_engine, load_model_class, resolve_options

    cls = load_model_class(args.source)
    init, setup = _options(args.options, cls)
    model = cls(device=args.device, init_options=init or None)
    if getattr(cls, "setup_defaults", None):  # bad setup options are bad input too
        setup = resolve_options(model, "setup", setup, cls.setup_defaults)
    engine = Engine(progress=False)  # the command attaches its own (--no-progress)
    configure_engine(cls, engine)
    return model, engine, setup


def _summary(result: RunResult) -> str:
    lines = [f"{result.mode}: {result.ended} after {result.steps} steps, {result.epochs} epochs "
             f"in {result.seconds:.2f}s" + (f" ({result.skipped} skipped)" if result.skipped
                                            else "")]
    if result.reason:
        lines.append(f"  why: {result.reason}")
    lines += [f"  {name}: {_number(value)}" for name, value in result.metrics.items()]
    timings = result.timings
    if "step_ms_median" in timings:
        lines.append(f"  {timings['measured_steps']} steps measured after {timings['warmup']} "
                     f"warm-up on {timings['device']}: {timings['steps_per_s']:.1f} steps/s"
                     + (f", {timings['samples_per_s']:.0f} samples/s"
                        if timings.get("samples_per_s") else ""))
        lines.append(f"  step time: median {timings['step_ms_median']:.3f} ms, "
                     f"p90 {timings['step_ms_p90']:.3f} ms, mean {timings['step_ms_mean']:.3f} ms")
    if result.outputs is not None:
        lines.append(f"  outputs: {len(result.outputs)} batches collected")
    for key in ("phases", "hooks"):
        if key in result.timings:
            rows = result.timings[key]
            lines.append(f"  time in {key}:" if rows else f"  time in {key}: (no {key})")
            lines += [f"    {r['phase']:<15} {r['hook'] or '':<30} {r['calls']:>7} calls "
                      f"{r['total_ms']:>10.3f} ms {r['mean_us']:>10.1f} µs/call" for r in rows]
    lines += [f"  {name}: {path}" for name, path in result.files.items()]
    return "\n".join(lines)


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _json(result: RunResult) -> str:
    data = {k: v for k, v in vars(result).items() if k != "outputs"}
    data["outputs"] = None if result.outputs is None else len(result.outputs)
    return json.dumps(data, indent=2, default=str)


def _is_config(source: str) -> bool:
    return source.endswith((".toml", ".json"))


def _prepare_config(args: argparse.Namespace) -> PreparedRun:
    """A config run, with --mode/--epochs/--steps/--device as overrides."""
    from ..config.runconfig import load_config
    from ..runs import prepare

    overrides = list(args.options)
    overrides += [f"{key}={getattr(args, key)!r}" for key in ("mode", "epochs", "steps", "device")
                  if getattr(args, key) is not None]
    if args.resume and args.restart:
        raise UsageError("--resume and --restart exclude each other")
    config = load_config(args.source, overrides)
    return prepare(config, args.runs_dir, resume=args.resume, restart=args.restart,
                   progress=args.progress, packs=_packs_asked_for(args),
                   base=Path(args.source).resolve().parent, backend=args.backend)


def _untrained_warning(args: argparse.Namespace) -> None:
    """``--mode eval``/``infer`` of a model or config loads no trained weights: say so,
    once, and how to use a trained run's."""
    mode = getattr(args, "mode", None)
    if args.command == "run" and mode in ("eval", "infer"):
        print(f"runmodel: warning: --mode {mode} runs the model with its initial weights (no "
              f"trained weights are loaded); to {mode} a trained run, use `runmodel {mode} "
              f"RUN_DIR`", file=sys.stderr)


def _execute(args: argparse.Namespace, extra: Sequence[str] = ()) -> int:
    from ..modes import Benchmark, Profile
    from ..runs import INTERRUPTED, list_runs, resume_dir, runs_table
    from ..runs.folder import is_run, is_script_run

    if args.command == "runs":
        print(runs_table(list_runs(args.dir)))
        return EXIT_OK
    if args.command in ("eval", "infer"):
        return _evaluate(args)
    if args.command == "resume" and is_run(Path(args.run_dir)) and is_script_run(
            Path(args.run_dir)):
        return _resume_script(args)
    if args.command in ("describe", "benchmark", "profile") and _is_script(args.source):
        return _script_command(args, extra)
    _untrained_warning(args)
    if args.command == "export":
        from ..checkpoint.sharded import export

        try:
            used, out = export(args.path, args.out)
        except (OSError, ValueError) as error:
            raise UsageError(str(error).strip("'\"")) from error
        print(f"exported {used} to {out}", file=sys.stderr)
        return EXIT_OK
    if args.command == "resume" or (args.command == "run" and _is_config(args.source)):
        try:
            prepared = resume_dir(args.run_dir, progress=args.progress, epochs=args.epochs,
                                  steps=args.steps, packs=_packs_asked_for(args)
                                  ) if args.command == "resume" else _prepare_config(args)
        except (OSError, ImportError, ValueError, TypeError, KeyError, SyntaxError,
                UsageError) as error:
            raise UsageError(str(error).strip("'\"")) from error
        if prepared.lead:
            print(f"run directory: {prepared.directory}"
                  + (f" (resuming from {prepared.checkpoint})" if prepared.checkpoint else ""),
                  file=sys.stderr)
        result = prepared.run()
        if not prepared.lead:  # the processes of a distributed run have the same result
            return EXIT_OK
        print(_json(result) if args.json else _summary(result))
        if result.reason == INTERRUPTED:
            print(f"runmodel: interrupted; continue it with `runmodel resume "
                  f"{prepared.directory}`", file=sys.stderr)
            return EXIT_INTERRUPTED
        return EXIT_OK
    try:
        if args.command == "benchmark":
            mode: Any = Benchmark(measure=args.measure, warmup=args.warmup)
        elif args.command == "profile":
            mode = Profile(measure=args.measure, warmup=args.warmup, directory=args.dir)
        else:
            mode = getattr(args, "mode", None) or "train"
        if args.command in ("benchmark", "profile"):
            mode.budget(args.steps)  # too few steps is bad input: say so before loading
        model, engine, setup = _load(args)
    except (OSError, ImportError, ValueError, TypeError, SyntaxError, UsageError) as error:
        raise UsageError(str(error)) from error
    if args.command == "describe":
        print(_describe(args.source, model, engine, setup))
        return EXIT_OK
    if args.command == "run" and args.progress and getattr(mode, "kind", mode) == "train":
        from ..packs import Progress

        engine.attach(Progress())
    engine.attach(*_packs_asked_for(args))
    distributed = args.command == "run" and env.launched()
    result = engine.run(model, mode, steps=args.steps, epochs=getattr(args, "epochs", None),
                        setup_options=setup or None,
                        backend=(args.backend or "ddp") if distributed else None)
    if not distributed or env.rank() == 0:  # the processes of a ddp run have the same result
        print(_json(result) if args.json else _summary(result))
    return EXIT_OK


def _is_script(source: str) -> bool:
    from ..runs.script import is_script

    return is_script(source)


def _script_command(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """describe, benchmark or profile a script: it runs up to its first engine.run."""
    from ..modes import Benchmark, Profile
    from ..runs.script import run_script

    def instead(engine: Any, model: Any, arguments: dict[str, Any]) -> Any:
        if args.command == "describe":
            return _describe(args.source, model, engine, arguments["setup_options"] or {})
        return engine.run(model, mode, steps=args.steps, backend=arguments["backend"],
                          setup_options=arguments["setup_options"])

    try:
        if args.command == "benchmark":
            mode: Any = Benchmark(measure=args.measure, warmup=args.warmup)
        elif args.command == "profile":
            mode = Profile(measure=args.measure, warmup=args.warmup,
                           directory=None if args.dir is None else Path(args.dir).resolve())
        if args.command != "describe":
            mode.budget(args.steps)
    except (ValueError, TypeError) as error:
        raise UsageError(str(error)) from error
    result = run_script(args.source, extra, os.getcwd(), instead)
    if args.command == "describe":
        print(result)
    else:
        print(_json(result) if args.json else _summary(result))
    return EXIT_OK


def _script_record(run_dir: Path) -> dict[str, Any]:
    from .._io import read_json

    record = read_json(run_dir / "run.json")
    if not record.get("script") or not Path(record["script"]).is_file():
        raise UsageError(f"{run_dir} is a script run, and its script "
                         f"{record.get('script')!r} is not there to run")
    return record


def _resume_script(args: argparse.Namespace) -> int:
    """``runmodel resume RUN_DIR`` of a script run: the script, run as it was started, up
    to its engine.run, which continues the run (``resume="auto"``) to the asked length."""
    from ..runs.script import run_script

    run_dir = Path(args.run_dir).resolve()
    record = _script_record(run_dir)

    def instead(engine: Any, model: Any, arguments: dict[str, Any]) -> Any:
        epochs = args.epochs if args.epochs is not None else record.get(
            "epochs", arguments["epochs"])
        steps = args.steps if args.steps is not None else record.get("steps", arguments["steps"])
        return engine.run(model, arguments["mode"], epochs=epochs, steps=steps,
                          setup_options=arguments["setup_options"],
                          backend=arguments["backend"], resume="auto",
                          run_dir=arguments["run_dir"] or run_dir)

    print(f"run directory: {run_dir} (a run of {record['script']})", file=sys.stderr)
    result = run_script(record["script"], record.get("argv") or [], record.get("cwd", "."),
                        instead)
    print(_json(result) if args.json else _summary(result))
    return EXIT_OK


def _evaluate(args: argparse.Namespace) -> int:
    """``runmodel eval|infer RUN_DIR``: the run's model with its chosen weights, on its
    data; eval adds its result to the run's eval.json, infer saves the outputs."""
    import torch

    from ..runs.config_run import build, load_run_config
    from ..runs.evaluate import choose_weights, evaluate_model, record_eval
    from ..runs.folder import is_run, is_script_run
    from ..runs.script import run_script

    run_dir = Path(args.run_dir).resolve()
    if not is_run(run_dir):
        raise UsageError(f"{args.run_dir} is not a run folder (it has no config.json or "
                         f"run.json); give a folder that `runmodel runs` lists")
    output = Path(args.output).resolve() if args.command == "infer" else None
    try:
        weights = choose_weights(run_dir, args.checkpoint).resolve()
    except FileNotFoundError as error:
        raise UsageError(str(error)) from error
    print(f"runmodel {args.command}: {run_dir.name} with {weights}", file=sys.stderr)
    if is_script_run(run_dir):
        record = _script_record(run_dir)
        result = run_script(record["script"], record.get("argv") or [], record.get("cwd", "."),
                            lambda engine, model, arguments: evaluate_model(
                                model, weights, args.command,
                                setup_options=arguments["setup_options"]))
    else:
        try:
            config, base = load_run_config(run_dir)
            _, model, _ = build(config, base, backend=False)
        except (OSError, ImportError, ValueError, TypeError, KeyError) as error:
            raise UsageError(str(error).strip("'\"")) from error
        result = evaluate_model(model, weights, args.command)
    if output is not None:
        torch.save(result.outputs, output)
        result.files["outputs"] = str(output)
    else:
        key = record_eval(run_dir, weights, result)
        result.files["eval.json"] = f"{run_dir / 'eval.json'} [{key}]"
    print(_json(result) if args.json else _summary(result))
    return EXIT_OK


def _check_config_launch(args: argparse.Namespace) -> None:
    """Before a config run is handed to torchrun: the config reads, and its backend
    agrees with --backend (as each process will check again)."""
    if not Path(args.source).is_file():  # said before torch is imported
        raise UsageError(f"{args.source}: no such config file")
    from ..config.runconfig import load_config
    from ..runs.torchrun import with_backend

    try:
        config = load_config(args.source, args.options)

        with_backend(config, args.backend)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise UsageError(str(error).strip("'\"")) from error


def _resume_launch(args: argparse.Namespace) -> bool:
    """Whether ``runmodel resume RUN_DIR`` hands the run to torchrun: a config run that
    ran in several processes starts again in as many (``args.nproc_per_node`` is set to
    the recorded number where not given), or launcher options were given (another
    number of processes: the checkpoint is resharded, docs/distributed.md)."""
    from ..runs.folder import read_status
    from ..runs.torchrun import BACKENDS

    status = read_status(Path(args.run_dir))
    recorded = status.get("world_size", 1)
    asked = launch.asked_for(args)
    if not isinstance(recorded, int) or (recorded <= 1 and not asked and status.get(
            "backend") not in BACKENDS):  # (ddp or fsdp in one process: torchrun's too)
        return False
    if not asked and status.get("nnodes", 1) > 1:
        raise UsageError(f"{args.run_dir} ran on {status['nnodes']} machines, "
                         f"{status.get('nproc_per_node')} processes each: resume it on each "
                         f"machine with the launcher options it was started with (--nnodes, "
                         f"--nproc-per-node, --rdzv-endpoint...)")
    if getattr(args, "nproc_per_node", None) is None:
        args.nproc_per_node = str(status.get("nproc_per_node", recorded))
    return True


def _launch_config_run(args: argparse.Namespace, argv: Sequence[str],
                       command: str = "run") -> int:
    """A config run handed to torchrun; if a process fails, the run's status says which
    failed first (rank 0 says where the run folder is)."""
    import tempfile

    from ..runs.config_run import LAUNCH_RECORD, record_launch_failure

    with tempfile.TemporaryDirectory(prefix="runmodel-launch-") as folder:
        told = Path(folder) / "run_dir"
        os.environ[LAUNCH_RECORD] = str(told)  # torchrun's processes inherit it
        try:
            return launch.launch(args, argv, command, on_failure=lambda rank, text: (
                record_launch_failure(Path(told.read_text()), rank, text)
                if told.is_file() else None))
        finally:
            os.environ.pop(LAUNCH_RECORD, None)


def _packs_asked_for(args: argparse.Namespace) -> list[Any]:
    from ..packs import Timer

    return [Timer()] if getattr(args, "timer", False) else []


def _describe(source: str, model: Model, engine: Engine, setup: dict[str, Any]) -> str:
    cls = type(model)
    lines = [f"model: {cls.__qualname__} from {source}", f"device: {model.device}"]
    native = model.model()
    parameters = getattr(native, "parameters", None)
    if callable(parameters):
        count = sum(p.numel() for p in parameters())
        lines.append(f"module: {type(native).__name__}, {count:,} parameters")
    for kind, options in (("init", model.init_options), ("setup", setup)):
        if options:
            lines.append(f"{kind} options: " + ", ".join(f"{k}={v!r}" for k, v in options.items()))
    return "\n".join(lines) + "\n\n" + engine.describe()


def _print_hint(error: BaseException) -> None:
    """A missing optional module (scikit-learn, matplotlib...): say which extra brings it."""
    from ..extras import hint

    text = hint(error)
    if text:
        print(f"  {text}", file=sys.stderr)


def _sweep(args: argparse.Namespace) -> int:
    """``runmodel sweep``: bad input is exit 2 before any trial; trials failing in a row
    exit 1; Ctrl-C exits 130 with the running trials saved."""
    try:
        from ..sweeps import SweepError, SweepFailed, parse_param, sweep

        params = dict(parse_param(text) for text in args.params)
        result = sweep(args.source, params=params, trials=args.trials,
                       metric=args.metric, direction=args.direction, sampler=args.sampler,
                       pruner=args.pruner, seed=args.seed, storage=args.storage,
                       jobs=args.jobs, runs_dir=args.runs_dir, overrides=args.options,
                       nproc_per_node=args.nproc_per_node)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (SweepError, ImportError) as error:
        if args.debug:
            traceback.print_exception(error)
        print(f"runmodel sweep: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except SweepFailed as error:
        print(f"runmodel sweep: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{result.complete} complete, {result.pruned} pruned, {result.failed} failed "
          f"in {result.directory}")
    if result.best:
        best = result.best
        print(f"best: trial {best['number']}, {result.metric} "
              f"{best['value']:.4f}, " + ", ".join(f"{k}={v}" for k, v in best["params"].items())
              + f"\n  {best['run_dir']}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``runmodel`` command; returns the exit code."""
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extra = parser.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    if extra and not (args.command in ("describe", "benchmark", "profile")
                      and _is_script(args.source)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "plot":
        return plotting.main(args)
    if args.command == "sweep":
        return _sweep(args)
    try:
        if args.command == "run" and args.backend and not (
                launch.asked_for(args) or env.launched()):
            raise UsageError(f"--backend {args.backend} picks the distributed backend of a run "
                             f"in several processes: add --nproc-per-node N (a config may name "
                             f"its backend itself: backend = {{type = \"{args.backend}\"}})")
        if args.command == "run" and launch.asked_for(args):
            if _is_config(args.source):
                _check_config_launch(args)
                return _launch_config_run(args, argv)
            source_file = args.source.partition(":")[0]
            if source_file.endswith(".py") and not Path(source_file).is_file():
                raise UsageError(f"{args.source}: no such file {source_file!r}")
            return launch.launch(args, argv)
        if args.command == "resume" and not env.launched() and _resume_launch(args):
            return _launch_config_run(args, argv, "resume")
        return _execute(args, extra)
    except KeyboardInterrupt:
        print("runmodel: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `runmodel runs | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return EXIT_BROKEN_PIPE
    except UsageError as error:
        record_failure(error)
        if args.debug:
            traceback.print_exception(error.__cause__ or error)
        print(f"runmodel {args.command}: error: {error}", file=sys.stderr)
        _print_hint(error)
        return EXIT_USAGE
    except Exception as error:
        record_failure(error)  # a process torchrun started: for the launcher's report
        where = f" [rank {env.rank()}]" if env.launched() else ""
        if args.debug:
            traceback.print_exception(error)
        else:
            print(f"runmodel {args.command}{where}: error: {type(error).__name__}: {error}",
                  file=sys.stderr)
            for note in getattr(error, "__notes__", ()):
                print(f"  {note}", file=sys.stderr)
            _print_hint(error)
            print("  (run with --debug for the traceback)", file=sys.stderr)
        # refused by the setup-time checks: bad input, as a usage error (nothing ran)
        return EXIT_USAGE if refused_at_setup(error) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
