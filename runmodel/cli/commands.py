"""One handler per subcommand: ``handler(args) -> exit code``.

Each handler opens what it is given as a target (``runmodel.runs.target``: a config, a
model source, a script, or a run folder of either) and asks it for the action; none asks
which kind of source it has. What every handler shares is written once here: the mode of
``benchmark``/``profile``, the packs asked for (``--timer``) and how a result is printed.

Nothing here imports torch at import time: ``--help`` and usage errors stay fast. A
handler imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..backends.distributed import env
from ..core.timing import BenchmarkTimings, CallTime
from . import launch

if TYPE_CHECKING:
    from ..core import RunResult
    from ..runs.target import RunRequest, Target

__all__ = [
    "UsageError",
    "check_resume",
    "describe",
    "evaluate",
    "export",
    "last_words",
    "lr_find",
    "measure",
    "plot",
    "preempt_signals",
    "quiet",
    "report",
    "resume",
    "run",
    "runs",
    "sweep",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad input found before the run started (exit 2)."""


@contextlib.contextmanager
def bad_input(*kinds: type[BaseException]) -> Iterator[None]:
    """Errors of ``kinds`` (by default a target's ``TargetError``: a source, config, run
    folder or option that cannot be run) raised as one ``UsageError`` in their words."""
    if not kinds:
        from ..runs.target import TargetError

        kinds = (TargetError,)
    try:
        yield
    except kinds as error:
        raise UsageError(str(error)) from error


def _target(args: argparse.Namespace) -> Target:
    """The SOURCE the command names, with its ``--device``, ``--set``, ``--seed`` and
    script arguments."""
    from ..runs.target import open_target

    return open_target(
        args.source,
        device=args.device,
        options=args.options,
        argv=args.extra,
        seed=getattr(args, "seed", None),
    )


def _run_folder(args: argparse.Namespace) -> Target:
    """The RUN_DIR the command names."""
    from ..runs.target import open_run

    return open_run(args.run_dir)


def _packs(args: argparse.Namespace) -> tuple[Any, ...]:
    """The packs the command's options ask for: ``--timer``, a Timer."""
    if not getattr(args, "timer", False):
        return ()
    from ..packs import Timer

    return (Timer(),)


def _request(args: argparse.Namespace, **given: Any) -> RunRequest:
    from ..runs.target import RunRequest

    return RunRequest(
        epochs=args.epochs,
        steps=args.steps,
        iterations=getattr(args, "iterations", None),
        progress=args.progress,
        packs=_packs(args),
        preempt=preempt_signals(args),
        **given,
    )


def preempt_signals(args: argparse.Namespace) -> tuple[int, ...]:
    """The signals that preempt a run the command starts: SIGTERM (what schedulers send
    before they kill), and those of ``--preempt-signal``."""
    asked = [signal.SIGTERM, *(getattr(args, "preempt_signals", None) or ())]
    return tuple(dict.fromkeys(int(sig) for sig in asked))


def last_words(text: str, stream: TextIO | None = None) -> None:
    """``text`` on ``stream`` (stderr), as the command's last words: a closed or broken
    stream (``| tee`` ended by the same Ctrl-C, ``| head`` that read enough) drops it,
    and is pointed at the null device so that Python's flush at exit cannot fail either
    (which would turn the command's exit code into 120)."""
    stream = sys.stderr if stream is None else stream
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        quiet(stream)


def quiet(stream: TextIO) -> None:
    """Point a stream whose reader is gone at the null device (what is left in its
    buffer goes there too)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)


def report(result: RunResult, as_json: bool = False) -> None:
    """Print ``result``: as JSON, or as the summary (how the run ended, its metrics,
    timings and files), on stdout; a closed stdout costs the summary, never the exit
    code (the run's files say the same). The processes of a distributed run have the
    same result: rank 0 alone prints it."""
    if env.rank() == 0:
        last_words(_json(result) if as_json else summary(result), sys.stdout)


def summary(result: RunResult) -> str:
    lines = [
        f"{result.mode}: {result.ended} after {result.steps} steps"
        + (f" ({result.iterations} iterations)" if result.iterations is not None else "")
        + f", {result.epochs} epochs "
        f"in {result.seconds:.2f}s" + (f" ({result.skipped} skipped)" if result.skipped else "")
    ]
    if result.reason:
        lines.append(f"  why: {result.reason}")
    lines += [f"  {name}: {_number(value)}" for name, value in result.metrics.items()]
    bench = BenchmarkTimings.of(result.timings)
    if bench is not None:
        lines.append(
            f"  {bench.measured_steps} steps measured after {bench.warmup} "
            f"warm-up on {bench.device}: {bench.steps_per_s:.1f} steps/s"
            + (f", {bench.samples_per_s:.0f} samples/s" if bench.samples_per_s else "")
        )
        lines.append(
            f"  step time: median {bench.step_ms_median:.3f} ms, "
            f"p90 {bench.step_ms_p90:.3f} ms, mean {bench.step_ms_mean:.3f} ms"
        )
    if result.outputs is not None:
        lines.append(f"  outputs: {len(result.outputs)} batches collected")
    for key in ("phases", "hooks"):
        if key in result.timings:
            rows = [CallTime.of(row) for row in result.timings[key]]
            lines.append(f"  time in {key}:" if rows else f"  time in {key}: (no {key})")
            lines += [
                f"    {r.phase:<15} {r.hook or '':<30} {r.calls:>7} calls "
                f"{r.total_ms:>10.3f} ms {r.mean_us:>10.1f} µs/call"
                for r in rows
            ]
    lines += [f"  {name}: {path}" for name, path in result.files.items()]
    return "\n".join(lines)


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _json(result: RunResult) -> str:
    data = {k: v for k, v in vars(result).items() if k != "outputs"}
    if result.iterations is None:  # said only where the run counts them
        del data["iterations"]
    data["outputs"] = None if result.outputs is None else len(result.outputs)
    return json.dumps(data, indent=2, default=str)


# -- run ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """``runmodel run SOURCE``: a model, or a config in its run folder; with launcher
    options, the same in the processes torchrun starts."""
    if args.backend and not (launch.asked_for(args) or env.launched()):
        raise UsageError(
            f"--backend {args.backend} picks the distributed backend of a run "
            f"in several processes: add --nproc-per-node N (a config may name "
            f'its backend itself: backend = {{type = "{args.backend}"}})'
        )
    with bad_input(ValueError):
        launch.check_grace(args)
    if launch.asked_for(args):
        return _launch_run(args)
    mode = args.mode
    if mode in ("eval", "infer"):  # no trained weights: say so, once, and how to use them
        print(
            f"runmodel: warning: --mode {mode} runs the model with its initial weights (no "
            f"trained weights are loaded); to {mode} a trained run, use `runmodel {mode} "
            f"RUN_DIR`",
            file=sys.stderr,
        )
    with bad_input():
        result = _target(args).run(
            _request(
                args,
                mode=mode,
                backend=args.backend,
                runs_dir=args.runs_dir,
                resume=args.resume,
                restart=args.restart,
            )
        )
    report(result, args.json)
    return EXIT_OK


def _launch_run(args: argparse.Namespace) -> int:
    """``runmodel run SOURCE --nproc-per-node N``: checked here (before torch is
    imported where it can be), then handed to torchrun."""
    from ..config import is_config_file

    if is_config_file(args.source):
        _check_config_launch(args)
    else:
        source_file = args.source.partition(":")[0]
        if source_file.endswith(".py") and not Path(source_file).is_file():
            raise UsageError(f"{args.source}: no such file {source_file!r}")
    return _launch_in_folder(args, "run")


def _check_config_launch(args: argparse.Namespace) -> None:
    """Before a config run is handed to torchrun: the config reads, and its backend
    agrees with --backend (as each process will check again)."""
    if not Path(args.source).is_file():  # said before torch is imported
        raise UsageError(f"{args.source}: no such config file")
    from ..config.runconfig import load_config
    from ..runs.torchrun import with_backend

    with bad_input(OSError, ValueError, TypeError):
        with_backend(load_config(args.source, args.options), args.backend)


def _launch_in_folder(args: argparse.Namespace, command: str) -> int:
    """A run (of a config, a model source) handed to torchrun; if a process fails, the
    status of its run folder says which failed first (rank 0 says where the run folder
    is)."""
    import tempfile

    from ..runs.folder_run import LAUNCH_RECORD, record_launch_failure

    with tempfile.TemporaryDirectory(prefix="runmodel-launch-") as folder:
        told = Path(folder) / "run_dir"
        os.environ[LAUNCH_RECORD] = str(told)  # torchrun's processes inherit it
        try:
            return launch.launch(
                args,
                args.argv,
                command,
                on_failure=lambda rank, text: (
                    record_launch_failure(Path(told.read_text()), rank, text)
                    if told.is_file()
                    else None
                ),
            )
        finally:
            os.environ.pop(LAUNCH_RECORD, None)


# -- benchmark, profile, describe -------------------------------------------------------------


def _timed_mode(args: argparse.Namespace) -> Any:
    """The ``Benchmark`` or ``Profile`` mode the options ask for; too few steps for its
    warm-up is bad input, said before anything loads."""
    from ..modes import Benchmark, Profile

    with bad_input(ValueError, TypeError):
        if args.command == "benchmark":
            mode: Any = Benchmark(measure=args.measure, warmup=args.warmup)
        else:  # the trace's folder as given here (a script runs from its own folder)
            mode = Profile(
                measure=args.measure,
                warmup=args.warmup,
                directory=None if args.dir is None else Path(args.dir).resolve(),
            )
        mode.budget(args.steps)
    return mode


def measure(args: argparse.Namespace) -> int:
    """``runmodel benchmark|profile SOURCE``: the source's steps timed (profiled)."""
    from ..runs.target import Measure

    mode = _timed_mode(args)
    with bad_input():
        result = _target(args).run_with(Measure(mode, args.steps, _packs(args)))
    report(result, args.json)
    return EXIT_OK


def describe(args: argparse.Namespace) -> int:
    """``runmodel describe SOURCE``: the model and its resolved hook table; nothing runs."""
    with bad_input():
        print(_target(args).describe())
    return EXIT_OK


def lr_find(args: argparse.Namespace) -> int:
    """``runmodel lr-find SOURCE``: the learning-rate range test on the source's model,
    which is left as it was; the suggestion printed, the loss drawn against the rate."""
    from ..runs.lr_find import LRFind

    plot = None if args.output is None else Path(args.output).resolve()
    if plot is not None:
        from ..extras import require

        with bad_input(ModuleNotFoundError):
            require("matplotlib", needed_by="runmodel lr-find")
    with bad_input(), bad_input(ValueError, TypeError):
        action = LRFind(args.start_lr, args.end_lr, args.steps, plot)
        result = _target(args).run_with(action)
    last_words(
        json.dumps(
            {**vars(result), "plot": None if result.plot is None else str(result.plot)}, indent=2
        )
        if args.json
        else result.summary(),
        sys.stdout,
    )
    return EXIT_OK


# -- run folders: runs, resume, eval, infer, export ---------------------------------------------


def runs(args: argparse.Namespace) -> int:
    """``runmodel runs [DIR]``: the table of runs, from their JSON files alone (no torch),
    folded to the terminal's width."""
    from ..runs.table import list_runs, runs_table, terminal_width

    with bad_input(ValueError):
        print(runs_table(list_runs(args.dir), width=terminal_width(), columns=args.columns))
    return EXIT_OK


def resume(args: argparse.Namespace) -> int:
    """``runmodel resume RUN_DIR``: its run continued; a run of several processes (or one
    of ``ddp``/``fsdp``) under torchrun again, in as many unless told otherwise."""
    with bad_input():
        target = _run_folder(args)
        if not env.launched() and _relaunch(args, target):
            return _launch_in_folder(args, "resume")
    with bad_input(ValueError):
        launch.check_grace(args)
    with bad_input():
        result = target.resume(_request(args))
    report(result, args.json)
    return EXIT_OK


def _relaunch(args: argparse.Namespace, target: Target) -> bool:
    """Whether ``runmodel resume`` hands the run to torchrun: its run needs it (the
    processes it records; ``args.nproc_per_node`` is set to them where not given), or
    launcher options were given (another number of processes: the checkpoint is
    resharded, docs/distributed.md)."""
    processes = target.processes()
    asked = launch.asked_for(args)
    if processes is None:
        return asked
    if not asked and processes["nnodes"] > 1:
        raise UsageError(
            f"{args.run_dir} ran on {processes['nnodes']} machines, "
            f"{processes['nproc_per_node']} processes each: resume it on each "
            f"machine with the launcher options it was started with (--nnodes, "
            f"--nproc-per-node, --rdzv-endpoint...)"
        )
    if getattr(args, "nproc_per_node", None) is None:
        args.nproc_per_node = str(processes["nproc_per_node"])
    return True


def evaluate(args: argparse.Namespace) -> int:
    """``runmodel eval|infer RUN_DIR``: the run's model with its chosen weights, on its
    data; eval adds its result to the run's eval.json, infer saves the outputs."""
    from ..runs.target import WithWeights
    from ..runs.weights import choose_weights, record_eval, weights_kind
    from ..session.folder import EVAL, is_run

    if not is_run(Path(args.run_dir)):
        raise UsageError(
            f"{args.run_dir} is not a run folder (it has no config.json or "
            f"run.json); give a folder that `runmodel runs` lists"
        )
    with bad_input():
        target = _run_folder(args)
        assert target.directory is not None  # opened from a run folder
        run_dir = target.directory
        output = Path(args.output).resolve() if args.command == "infer" else None
        with bad_input(FileNotFoundError):
            weights = choose_weights(run_dir, args.checkpoint).resolve()
        _check_weights(weights)
        averaged = " (its averaged weights)" if args.averaged else ""
        last_words(
            f"runmodel {args.command}: {run_dir.name} at its {weights_kind(weights)}"
            f"{averaged}, with {weights}"
        )
        if args.averaged:  # a checkpoint without an average: said in one line, before
            from ..checkpoint.export import averaged_weights

            with bad_input(ValueError):
                averaged_weights(weights)
        result = target.run_with(WithWeights(weights, args.command, args.averaged, args.split))
    if output is not None:
        import torch

        torch.save(result.outputs, output)
        result.files["outputs"] = str(output)
    else:
        key = record_eval(run_dir, weights, result, args.averaged, args.split)
        result.files[EVAL] = f"{run_dir / EVAL} [{key}]"
    report(result, args.json)
    return EXIT_OK


def _check_weights(weights: Path) -> None:
    """A weights file that cannot be read (cut short, damaged, not a checkpoint) is bad
    input: said in one line, in the checkpoint reader's words, before the run. (Read
    memory-mapped, so a whole file costs no second read of its tensors.)"""
    if weights.is_dir():  # a sharded checkpoint: read whole in the run
        return
    import torch

    from .. import checkpoint

    try:
        torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # what is wrong, said by the checkpoint reader
        with bad_input(ValueError, OSError):
            checkpoint.load(weights)


def export(args: argparse.Namespace) -> int:
    """``runmodel export PATH OUT``: a checkpoint's full model weights, one plain file
    (``--averaged``: an EMA or SWA pack's average); ``--format pt2|onnx``: a run folder's
    module as a program (``runs/export.py``), checked against the module on a batch."""
    if args.format != "state_dict":
        return _export_program(args)
    from ..checkpoint.export import export as export_weights
    from ..runs.weights import choose_weights, weights_kind
    from ..session.folder import MODEL, is_run

    path, kind = Path(args.path), "checkpoint"
    if is_run(path):  # the weights `runmodel eval` uses: its best, else its last
        with bad_input(FileNotFoundError):
            chosen = choose_weights(path, args.checkpoint)
        if chosen.name != MODEL:  # (no checkpoint at all: said as for any folder)
            path, kind = chosen, weights_kind(chosen)
    elif args.checkpoint is not None:
        raise UsageError(
            f"--checkpoint picks a run folder's weights, and {args.path} is not a run "
            f"folder: give the checkpoint itself as PATH ({args.checkpoint})"
        )
    with bad_input(OSError, ValueError):
        used, out = export_weights(path, args.out, averaged=args.averaged)
    averaged = ", its averaged weights" if args.averaged else ""
    last_words(f"exported {used} to {out} (the {kind}{averaged})")
    return EXIT_OK


def _export_program(args: argparse.Namespace) -> int:
    """``--format pt2|onnx``: the run folder's model, its chosen weights loaded, exported
    and checked; a PATH that is no run folder, or a missing ONNX extra, is exit 2."""
    from ..session.folder import is_run

    if not is_run(Path(args.path)):
        raise UsageError(
            f"--format {args.format} exports a run's model, made as the run's "
            f"config, model source or script makes it: PATH must be a run "
            f"folder, and {args.path} is not one (a checkpoint alone holds "
            f"weights; --format state_dict exports those)"
        )
    if Path(args.out).is_dir():  # before the run's model is made
        raise UsageError(
            f"{args.out} is a folder: give the program's file, such as "
            f"{Path(args.out) / ('model.' + args.format)}"
        )
    from ..extras import require
    from ..runs.export import ExportProgram
    from ..runs.target import open_run
    from ..runs.weights import choose_weights

    if args.format == "onnx":
        with bad_input(ModuleNotFoundError):
            for name in ("onnx", "onnxscript", "onnxruntime"):
                require(name, needed_by="runmodel export --format onnx")
    with bad_input():
        target = open_run(args.path)
        assert target.directory is not None
        with bad_input(FileNotFoundError):
            weights = choose_weights(target.directory, args.checkpoint).resolve()
        _check_weights(weights)
        with bad_input(ValueError):
            exported = target.run_with(
                ExportProgram(weights, Path(args.out).resolve(), args.format, args.averaged)
            )
    last_words(exported.summary())
    return EXIT_OK


# -- sweeps and plots ----------------------------------------------------------------------------


def sweep(args: argparse.Namespace) -> int:
    """``runmodel sweep``: bad input is exit 2 before any trial; trials failing in a row
    exit 1; Ctrl-C exits 130 with the running trials saved."""
    try:
        from ..sweeps import SweepError, SweepFailed, parse_param, sweep

        params = dict(parse_param(text) for text in args.params)
        result = sweep(
            args.source,
            params=params,
            trials=args.trials,
            metric=args.metric,
            direction=args.direction,
            sampler=args.sampler,
            pruner=args.pruner,
            seed=args.seed,
            storage=args.storage,
            jobs=args.jobs,
            runs_dir=args.runs_dir,
            overrides=args.options,
            nproc_per_node=args.nproc_per_node,
            heartbeat=args.heartbeat,
        )
    except KeyboardInterrupt:  # the running trials saved themselves
        return EXIT_INTERRUPTED
    except (SweepError, ImportError) as error:
        raise UsageError(str(error)) from error
    except SweepFailed as error:
        last_words(f"runmodel sweep: error: {error}")
        return EXIT_FAILED
    said = (
        f"{result.complete} complete, {result.pruned} pruned, {result.failed} failed in "
        f"{result.directory}"
    )
    if result.best:
        best = result.best
        said += (
            f"\nbest: trial {best['number']}, {result.metric} {best['value']:.4f}, "
            + ", ".join(f"{k}={v}" for k, v in best["params"].items())
            + f"\n  {best['run_dir']}"
        )
    last_words(said, sys.stdout)
    return EXIT_OK


def plot(args: argparse.Namespace) -> int:
    """``runmodel plot RUN_DIR...``: their curves in one PNG (``runs/plot.py``)."""
    from ..runs import plot as plotting

    return plotting.main(args)


def check_resume(args: argparse.Namespace) -> int:
    """``runmodel check-resume SOURCE``: a run straight, the same run killed and resumed,
    compared (``runs/check_resume.py``); exit 0 when the resume is exact, else 1."""
    from ..runs.check_resume import CheckRequest
    from ..runs.check_resume import check_resume as check

    with bad_input():
        verdict = check(
            CheckRequest(
                args.source,
                steps=args.steps,
                at=args.at,
                nproc_per_node=args.nproc_per_node,
                backend=args.backend,
                directory=None if args.dir is None else Path(args.dir),
                device=args.device,
                options=tuple(args.options),
                argv=tuple(args.extra),
            )
        )
    last_words(verdict.text(), sys.stdout)
    return EXIT_OK if verdict.exact else EXIT_FAILED


def script_arguments_allowed(args: argparse.Namespace) -> bool:
    """Whether arguments argparse did not know may be a script's: ``describe``,
    ``benchmark``, ``profile`` and ``check-resume`` of a script pass them to it."""
    if args.command not in ("describe", "benchmark", "profile", "check-resume"):
        return False
    from ..runs.script import is_script

    return is_script(args.source)


def unknown(extra: Sequence[str]) -> list[str]:
    """argparse's leftover arguments, less the ``--`` that ends runmodel's own."""
    return list(extra[1:] if extra and extra[0] == "--" else extra)
