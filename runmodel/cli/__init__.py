"""The ``runmodel`` command: run, benchmark, profile and describe a model, a script or a
config; list, resume, evaluate, export, sweep and plot runs.

    parser.py     the parser: one function per subcommand, each naming its handler
    commands.py   one handler per subcommand, over one notion of what is run
                  (``runmodel.runs.target``: a config, a model source, a script)
    launch.py     ``--nproc-per-node N``: the hand-off to torchrun

``runmodel run SOURCE --nproc-per-node N`` (and torchrun's other options) hands the run to
torchrun; each process it starts runs the command again with the ``ddp`` backend (or
``--backend fsdp``), and process rank 0 prints the result. A config run does the same
(``runs/torchrun.py``: rank 0 claims its folder and writes its files), and ``runmodel
resume`` of it starts it again in as many processes as it ran in.

A model's file may define ``configure(engine)``; it is called with the run's engine before
the run (of a source, or of a config naming the model), to attach the hooks and packs that
the file's model wants.

Here: ``main``, and how an error becomes an exit code (``EXIT_*``, defined with the
handlers in ``commands.py``): bad input 2, a failed
run 1, Ctrl-C 130, a run preempted by a signal 128 + its number (143 for SIGTERM), a reader
gone from the pipe 141. What the command says last is said so that a closed stdout or
stderr (``| tee`` ended by the same Ctrl-C) never changes its exit code (``last_words``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import traceback
from collections.abc import Sequence

from ..backends.distributed import env
from ..backends.distributed.failures import record_failure
from ..core.state import REFUSED, Interrupted, refused_at_setup
from . import launch
from .commands import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    last_words,
    quiet,
    script_arguments_allowed,
    unknown,
)
from .parser import parser

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "main",
]

EXIT_BROKEN_PIPE = 141  # as a process that SIGPIPE ended


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``runmodel`` command; returns the exit code."""
    made = parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args, extra = made.parse_known_args(argv)
        args.argv, args.extra = argv, unknown(extra)  # a launch passes them on; a script too
        if args.extra and not script_arguments_allowed(args):
            made.error(f"unrecognized arguments: {' '.join(args.extra)}")
    except SystemExit as refused:  # argparse's usage error, exit 2 (or --help's exit 0)
        if refused.code == EXIT_USAGE:
            _flushed()
            launch.ended_on_purpose(EXIT_USAGE)
        raise
    try:
        code = _run(args)
        return launch.ended_on_purpose(code) if code == EXIT_USAGE else code
    except Interrupted as stopped:  # saved, at the step every process of a launch stopped at
        return launch.ended_on_purpose(_interrupted(stopped), saved=True)
    finally:
        _flushed()


def _run(args: argparse.Namespace) -> int:
    """The subcommand's handler, its errors turned into exit codes."""
    try:
        code: int = args.func(args)
        return code
    except Interrupted:  # saved and ended: main says how
        raise
    except KeyboardInterrupt as stopped:
        return _interrupted(stopped)
    except BrokenPipeError:  # `runmodel runs | head`: the reader has all it wanted
        quiet(sys.stdout)  # no error at exit
        return EXIT_BROKEN_PIPE
    except UsageError as error:
        record_failure(error)
        if args.debug:
            traceback.print_exception(error.__cause__ or error)
        last_words(f"runmodel {args.command}: error: {error}")
        _print_hint(error)
        return EXIT_USAGE
    except Exception as error:
        record_failure(error)  # a process torchrun started: for the launcher's report
        if args.debug:
            traceback.print_exception(error)
        elif refused_at_setup(error):  # bad input the run found before its first step
            last_words(
                f"runmodel {args.command}: error: {type(error).__name__}: {error} "
                f"({REFUSED.removeprefix('runmodel: ')})"
            )
        else:
            where = f" [rank {env.rank()}]" if env.launched() else ""
            last_words(
                "\n".join(
                    [
                        f"runmodel {args.command}{where}: error: {type(error).__name__}: {error}",
                        *(f"  {note}" for note in getattr(error, "__notes__", ())),
                    ]
                )
            )
            _print_hint(error)
            last_words("  (run with --debug for the traceback)")
        return EXIT_USAGE if refused_at_setup(error) else EXIT_FAILED


def _interrupted(stopped: KeyboardInterrupt) -> int:
    """Ctrl-C (130), or a preemption signal (``runmodel.Preempted``: 128 + its number,
    143 for SIGTERM), as a shell reports a process that the signal ended. A process that
    torchrun started says nothing of it: the launcher says it once for the run (rank 0
    said where the run saved)."""
    number = int(getattr(stopped, "signal", signal.SIGINT))
    if number == signal.SIGINT:
        last_words("runmodel: interrupted")
        return EXIT_INTERRUPTED
    if not env.launched():
        last_words(f"runmodel: preempted by {signal.Signals(number).name}")
    return 128 + number


def _flushed() -> None:
    """stdout and stderr flushed now; one whose reader is gone is pointed at the null
    device, so that the flush at exit cannot turn the exit code into 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            quiet(stream)


def _print_hint(error: BaseException) -> None:
    """A missing optional module (scikit-learn, matplotlib...): say which extra brings it."""
    from ..extras import hint

    text = hint(error)
    if text:
        last_words(f"  {text}")


if __name__ == "__main__":
    sys.exit(main())
