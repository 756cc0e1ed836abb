"""``runmodel run SOURCE --nproc-per-node N``: the run handed off to torchrun.

The ``runmodel`` command started by a user (no torchrun around it) passes its launcher
options to ``torch.distributed.run``, with ``-m runmodel`` and the command's own arguments
as the program: torchrun starts the processes (and, across machines, meets the others at
its rendezvous), each runs ``runmodel run ...`` again, sees torchrun's environment and
trains with the ``ddp`` backend. When a process fails, torchrun ends the others and this
module reports the first failure (``backends/distributed/failures.py``).

Preemption: torchrun handles the run's preemption signals (``--signals-to-handle``: its
own, SIGTERM, SIGINT, SIGHUP, SIGQUIT, and those of ``--preempt-signal``) by sending the
signal on to its processes, which stop together after a step and save; it waits
``--preempt-grace`` seconds (``--shutdown-timeout``, default 30) before it sends them
SIGKILL. The command then exits 128 + the signal's number (143 for SIGTERM), as a shell
reports a process that the signal ended.

A launch also ends, at once and with no restart under ``--max-restarts``, when one of its
processes ends it on purpose (``ended_on_purpose``): a refusal at setup (bad input, a run
folder that holds the run already: exit 2, nothing written) or a stop by a preemption
signal that reached a process and not the launcher (the processes stopped together and
saved: exit 128 + N). The process writes the code in the launch's own folder (beside
``LAUNCH_RECORD``'s file), which the launcher reads; torchrun would take either for a
failure, and restart the run into a resume.

Nothing here imports torch until a run is launched, so ``runmodel --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..backends.distributed import env
from ..backends.distributed.failures import first_failure
from ..session.interrupt import say

__all__ = [
    "LAUNCH_OPTIONS",
    "PREEMPT_GRACE",
    "TORCHRUN_SIGNALS",
    "add_arguments",
    "asked_for",
    "check_grace",
    "ended_on_purpose",
    "launch",
    "preemption_arguments",
    "torchrun_arguments",
]

#: Seconds torchrun gives its processes to save after a preemption signal, before SIGKILL.
PREEMPT_GRACE = 30
#: The signals torchrun handles (and sends on to its processes) by default.
TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
#: The file, in the launch's own folder, where a process says how it ended the launch.
ENDED = "ended"
#: The loggers of torchrun's words on ending its processes.
TORCHRUN_LOGS = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing.api",
)
#: Seconds a refusing process waits for the launcher to end the others (and it) at once.
REFUSAL_WAIT_S = 30.0


class LaunchOption(NamedTuple):
    flag: str
    takes_value: bool
    help: str


#: torchrun's options that ``runmodel run`` takes, under the same names.
LAUNCH_OPTIONS: tuple[LaunchOption, ...] = (
    LaunchOption(
        "--nproc-per-node",
        True,
        "processes on this machine: a number, or auto, gpu "
        "or cpu (torchrun's); the run uses the ddp backend (or --backend, or a "
        "config's own)",
    ),
    LaunchOption("--nnodes", True, "machines, or MIN:MAX for an elastic run (default 1)"),
    LaunchOption("--node-rank", True, "this machine's rank, for --master-addr/--master-port"),
    LaunchOption("--master-addr", True, "the address of the machine with node rank 0"),
    LaunchOption("--master-port", True, "a free port on the machine with node rank 0"),
    LaunchOption("--rdzv-backend", True, "rendezvous backend (c10d with --rdzv-endpoint)"),
    LaunchOption("--rdzv-endpoint", True, "HOST:PORT where the machines meet"),
    LaunchOption("--rdzv-id", True, "the job's id: the same on every machine"),
    LaunchOption("--rdzv-conf", True, "rendezvous settings, KEY=VALUE,..."),
    LaunchOption(
        "--standalone",
        False,
        "one machine, a free port of its own (the default with one machine and no address given)",
    ),
    LaunchOption("--max-restarts", True, "restarts of the processes after a failure"),
    LaunchOption("--local-ranks-filter", True, "show output of these local ranks only (0,1)"),
)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser, text: str | None = None) -> None:
    """The launcher options, in a group of their own (``text`` describes it)."""
    group = parser.add_argument_group(
        "distributed (torchrun)",
        text
        or "start the run in several processes with torchrun "
        "(torch.distributed.run), each training with the ddp backend (or --backend fsdp); "
        "a config run too (docs/runs.md)",
    )
    for option in LAUNCH_OPTIONS:
        if option.takes_value:
            group.add_argument(
                option.flag,
                dest=_dest(option.flag),
                metavar="VALUE",
                type=_checked(option.flag),
                help=option.help,
            )
        else:
            group.add_argument(
                option.flag, dest=_dest(option.flag), action="store_true", help=option.help
            )
    group.add_argument(
        "--preempt-grace",
        type=_seconds,
        metavar="SECONDS",
        help="after a preemption signal, how long torchrun "
        "lets the processes save before it sends SIGKILL (its "
        f"--shutdown-timeout; default {PREEMPT_GRACE}; with --nproc-per-node or another "
        "launcher option)",
    )


def _seconds(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of seconds >= 1")
    return int(text)


def _checked(flag: str) -> Any:
    """Values torchrun would refuse late (after importing torch), refused at once."""

    def check(text: str) -> str:
        if (
            flag == "--nproc-per-node"
            and text not in ("auto", "cpu", "gpu")
            and not (text.isdigit() and int(text) >= 1)
        ):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give a number of processes >= 1, or auto, cpu or gpu"
            )
        if flag in ("--node-rank", "--master-port", "--max-restarts") and not text.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
        parts = text.split(":", 1)
        if flag == "--nnodes" and not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give a number of machines >= 1, or MIN:MAX"
            )
        if flag == "--nnodes" and int(parts[0]) > int(parts[-1]):
            raise argparse.ArgumentTypeError(
                f"{text!r}: MIN:MAX with MIN <= MAX, as in {parts[-1]}:{parts[0]}"
            )
        return text

    return check


def check_grace(args: argparse.Namespace) -> None:
    """``--preempt-grace`` is torchrun's: refused for a run in this process (no launch
    takes it)."""
    if getattr(args, "preempt_grace", None) is not None and not (asked_for(args) or env.launched()):
        raise ValueError(
            f"--preempt-grace {args.preempt_grace}: torchrun's time to save after a "
            f"preemption signal, for a run in several processes: add --nproc-per-node N, "
            f"or drop it (a run in this process saves as soon as its step is done)"
        )


def asked_for(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask for a launch: a launcher option given, outside torchrun (a
    process torchrun started runs, never launches)."""
    return not env.launched() and any(
        getattr(args, _dest(o.flag), None) not in (None, False) for o in LAUNCH_OPTIONS
    )


def torchrun_arguments(args: argparse.Namespace) -> list[str]:
    """torchrun's command line for ``args``' launcher options. One machine with no address
    given is ``--standalone`` (a free port found for it), not torchrun's fixed 29500."""
    found: list[str] = []
    for option in LAUNCH_OPTIONS:
        value = getattr(args, _dest(option.flag), None)
        if value in (None, False):
            continue
        found += [option.flag] if not option.takes_value else [option.flag, str(value)]
    one_machine = getattr(args, "nnodes", None) in (None, "1", "1:1")
    addressed = any(
        getattr(args, name, None) is not None
        for name in ("rdzv_endpoint", "master_addr", "master_port", "rdzv_backend")
    )
    if one_machine and not addressed and "--standalone" not in found:
        found.append("--standalone")
    return found


def preemption_arguments(args: argparse.Namespace) -> list[str]:
    """torchrun's options for the run's preemption: the signals it handles and sends on to
    its processes (its own, and those of ``--preempt-signal``), and how long it waits for
    them to save (``--preempt-grace``) before SIGKILL."""
    asked = [signal.Signals(number).name for number in getattr(args, "preempt_signals", None) or ()]
    names = ",".join(dict.fromkeys([*TORCHRUN_SIGNALS, *asked]))
    grace = getattr(args, "preempt_grace", None) or PREEMPT_GRACE
    return ["--signals-to-handle", names, "--shutdown-timeout", str(grace)]


def _kill_deadline(args: argparse.Namespace) -> str:
    """When what is left of the run's processes is killed. Under SLURM, SLURM may kill
    them first: its job step's processes get its SIGKILL ``KillWait`` seconds after its
    own signal (a preemption's ``GraceTime`` first), whatever torchrun waits."""
    grace = preemption_arguments(args)[-1]
    if "SLURM_JOB_ID" in os.environ:
        return (
            f"SIGKILL from torchrun {grace} s on, or from SLURM once its KillWait (a "
            f"preemption's GraceTime) is up, whichever comes first"
        )
    return f"{grace} s before torchrun ends them with SIGKILL"


def launch(
    args: argparse.Namespace,
    argv: Sequence[str],
    command: str = "run",
    on_failure: Callable[[int, str], Any] | None = None,
) -> int:
    """Run ``python -m runmodel ARGV`` in the processes ``args`` ask torchrun for; the
    exit code: 0, or the first failed process's when it is 2 (bad input, found at setup),
    else 1 (the first failure is reported, and given to ``on_failure`` with its rank);
    128 + N when signal N stopped the run (torchrun sent it on to its processes)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    options = get_args_parser().parse_args(
        [*torchrun_arguments(args), *preemption_arguments(args), "-m", "runmodel", *argv]
    )
    quiet_on_purpose = _QuietOnPurpose()  # torchrun's "death signal" words after a refusal
    for name in TORCHRUN_LOGS:
        logging.getLogger(name).addFilter(quiet_on_purpose)
    try:
        run(options)  # not torch.distributed.run.main, which prints its own report
    except SignalException as stopped:  # torchrun handed it on to the processes
        if _ended() == 2:  # a process refused at setup and asked for the end: it said why
            return 2
        number = int(stopped.sigval)
        say(
            f"runmodel {command}: preempted by {signal.Signals(number).name}: handed on to "
            f"the run's processes, which stop after a step and save ({_kill_deadline(args)})"
        )
        return 128 + number
    except ChildFailedError as failed:
        rank, text = first_failure(failed)
        print(
            f"runmodel {command}: error: {text}; every process was ended (their errors are above)",
            file=sys.stderr,
        )
        if on_failure is not None:
            on_failure(rank, text)
        return 2 if failed.failures[rank].exitcode == 2 else 1
    finally:
        for name in TORCHRUN_LOGS:
            logging.getLogger(name).removeFilter(quiet_on_purpose)
    return _ended() or 0


def ended_on_purpose(code: int, saved: bool = False) -> int:
    """In a process this launcher started: the exit code ``code`` for a process that
    ends the launch on purpose, where torchrun would take it for a failure and restart
    the processes under ``--max-restarts``. A refusal at setup (``code`` 2) is written for
    the launcher, which is then asked (SIGTERM) to end the others and this process at
    once (they may wait on this one); a stop by a signal that saved (``saved``: every
    process stopped at the same step) is written too, and the process exits 0 so that
    torchrun sees its group finish. Anything else, or outside such a launch: ``code``."""
    folder = _launch_folder()
    if folder is None or not (code == 2 or saved):
        return code
    try:
        with open(folder / ENDED, "x") as file:
            file.write(str(code))
        first = True
    except FileExistsError:
        first = False
    except OSError:
        return code
    if saved:
        return 0
    if first:
        os.kill(os.getppid(), signal.SIGTERM)  # torchrun's agent runs in the launcher
    time.sleep(REFUSAL_WAIT_S)  # ended by the launcher's SIGTERM well before
    return code


def _launch_folder() -> Path | None:
    """The launch's own folder, in a process the launcher started (None elsewhere)."""
    if not env.launched():  # (a usage error outside torchrun imports nothing more)
        return None
    from ..runs.folder_run import LAUNCH_RECORD

    record = os.environ.get(LAUNCH_RECORD)
    return Path(record).parent if record else None


def _ended() -> int | None:
    """The code a process of the launch wrote on ending it on purpose (None: none did)."""
    from ..runs.folder_run import LAUNCH_RECORD

    record = os.environ.get(LAUNCH_RECORD)
    with contextlib.suppress(OSError, ValueError):
        return int((Path(record).parent / ENDED).read_text()) if record else None
    return None


class _QuietOnPurpose(logging.Filter):
    """Drops torchrun's warnings once a process ended the launch on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _ended() is None
