"""``runmodel check-resume SOURCE|CONFIG``: does a run of this model resume exactly?

A run is trained K steps straight, recording a digest of the module's state after every
step. The same run is trained again, saved at step S by a ``Checkpoint`` pack, and killed
with SIGKILL during step S+1; then it is resumed from that checkpoint to step K. Each of
the three is a process of its own (``check_resume_child.py``), under torchrun with
``nproc_per_node``. Then:

* the state each ended with is compared bit for bit: the model's (weights, optimizer
  state), the engine's own (counters, the epoch's sums and mean loss) and the random
  generators'; the first tensor (or entry) that differs is named;
* the digests name the first step whose state differs (a step before S differing means
  the run does not even repeat itself: that is said instead);
* that step is run again in both worlds (straight, and resumed from S), with forward hooks
  on every module, and the first module whose output differs is named, or the batch, when
  the data differs already.

Without ``at``, S is chosen from the straight run: the step nearest the middle after
which the epoch goes on (mid-epoch), where there is one. The processes' files go to a
temporary folder (removed after) or to ``directory`` (kept). Exact: ``Verdict.exact``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .._io import read_json, write_json
from ..backends.distributed import env
from ..checkpoint.names import checkpoints_in, position
from .target import TargetError

__all__ = ["DEFAULT_STEPS", "CheckFailed", "CheckRequest", "Verdict", "check_resume", "choose_step"]

#: Steps trained when ``--steps`` is not given.
DEFAULT_STEPS = 20
#: Lines of a failed process's output shown with its error.
TAIL_LINES = 25


class CheckFailed(RuntimeError):
    """One of the check's runs failed (its error and the end of its output are in the
    message): the check could not be made."""


@dataclass(frozen=True)
class CheckRequest:
    """What ``runmodel check-resume`` is asked: the source (with its ``--device``,
    ``--set`` options and a script's arguments), the steps K, the step S to save at
    (None: chosen), the processes of each run (None: one, without torchrun; N: torchrun's
    ``--nproc-per-node N``), their distributed backend, and the folder to keep the runs'
    files in (None: a temporary one)."""

    source: str
    steps: int | None = None
    at: int | None = None
    nproc_per_node: int | None = None
    backend: str | None = None
    directory: Path | None = None
    device: str | None = None
    options: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()


@dataclass
class Verdict:
    """What the check found. ``exact``: the resumed run ended bit-identical to the
    straight one and every step's state agreed."""

    source: str
    steps: int
    saved_at: int
    where: str  # where S sits: "mid-epoch: epoch 0, its 10th step"
    processes: int = 1
    first_epoch: bool = False  # S is in the run's first epoch
    exact: bool = True
    first_tensor: str | None = None
    first_step: int | None = None
    module: str | None = None
    #: what was found, process by process (rank: lines, in the order of ``ORDER``)
    findings: dict[int, list[tuple[int, str]]] = field(default_factory=dict)

    #: what a process's findings say first: the steps, the module, the state at the end
    ORDER: ClassVar[tuple[str, ...]] = ("step", "module", "state")

    def found(self, rank: int, line: str, about: str = "step") -> None:
        """A difference seen in process ``rank`` (``about``: one of ``ORDER``): the
        resume is not exact."""
        self.exact = False
        self.findings.setdefault(rank, []).append((self.ORDER.index(about), line))

    def text(self) -> str:
        head = (
            f"check-resume {self.source}: {self.steps} steps; saved at step "
            f"{self.saved_at} ({self.where}), killed in step {self.saved_at + 1}, "
            f"resumed: {'exact' if self.exact else 'NOT exact'}"
        )
        said = {
            rank: [line for _, line in sorted(found, key=lambda kind_line: kind_line[0])]
            for rank, found in self.findings.items()
        }
        alike = len(said) == self.processes and all(lines == said[0] for lines in said.values())
        if alike or self.processes == 1:
            lines = said.get(0, [])
            if self.processes > 1:
                lines = [*lines, f"(the same in each of the {self.processes} processes)"]
        else:  # each process its own
            lines = [f"rank {rank}: {line}" for rank in sorted(said) for line in said[rank]]
        if self.exact:
            lines = [
                f"weights, optimizer state and random generators bit-identical to the "
                f"straight run's, and the state after each of steps {self.saved_at + 1}-"
                f"{self.steps}"
                + (f" in each of {self.processes} processes" if self.processes > 1 else "")
            ]
            if self.first_epoch:
                lines.append(
                    "(saved in the run's first epoch: with --steps above an "
                    "epoch's steps, the check saves in a later one, and what "
                    "carries over from one epoch to the next is checked too)"
                )
        return "\n".join([head, *(f"  {line}" for line in lines)])


# -- the check --------------------------------------------------------------------------------


def check_resume(request: CheckRequest, say: Callable[[str], None] | None = None) -> Verdict:
    """Run the check (see the module's docstring); ``say`` gets a line as each run
    starts. Bad input raises ``TargetError``; a run that failed, ``CheckFailed``."""
    say = say or _say
    steps = DEFAULT_STEPS if request.steps is None else request.steps
    _check_request(request, steps)
    with _folder(request.directory) as folder, _Processes(folder, request) as runs:
        write_json(
            runs.plan,
            {
                "source": request.source,
                "device": request.device,
                "options": list(request.options),
                "argv": list(request.argv),
                "steps": steps,
                "backend": request.backend,
            },
        )
        interrupted = folder / "interrupted"
        at = request.at
        if at is None:
            say(f"check-resume: training {steps} steps straight")
            runs.wait(runs.start("straight", folder / "straight"))
            at = choose_step(runs.digests("straight", 0))
            say(f"check-resume: training again, saving at step {at}, killed in step {at + 1}")
            runs.wait_killed(
                runs.start("killed", interrupted, "--save-at", str(at), "--kill", str(at)), at
            )
        else:
            say(
                f"check-resume: training {steps} steps straight, and again saving at step "
                f"{at}, killed in step {at + 1}"
            )
            straight = runs.start("straight", folder / "straight")
            killed = runs.start("killed", interrupted, "--save-at", str(at), "--kill", str(at))
            runs.wait(straight)
            runs.wait_killed(killed, at)
        done = len(runs.digests("straight", 0))
        if done < 2 or at >= done:
            raise TargetError(
                f"the run took {done} steps (its epochs or data end there), and "
                f"the check saves at a step S below them and kills the run in "
                f"step S+1: give --at below {done}"
                if done >= 2
                else f"the run took {done} step: the check needs 2 or more"
            )
        saved = _checkpoint(interrupted, at)
        say(f"check-resume: resuming from {saved.name} to step {done}")
        runs.wait(runs.start("resumed", interrupted, "--save-at", str(at), "--resume", str(saved)))
        verdict = _compare(runs, request.source, done, at)
        if verdict.first_step is not None:
            _rerun(runs, verdict, folder, saved, at, say)
    return verdict


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _check_request(request: CheckRequest, steps: int) -> None:
    if env.launched():
        raise TargetError(
            "check-resume starts its runs' processes itself (with torchrun for "
            "--nproc-per-node): run it outside torchrun"
        )
    if steps < 2:
        raise TargetError(
            f"--steps {steps}: the check saves at a step S and kills the run in "
            f"step S+1, so it needs 2 steps or more"
        )
    if request.at is not None and not 1 <= request.at < steps:
        raise TargetError(
            f"--at {request.at}: save at a step from 1 to {steps - 1} (the run "
            f"is killed in the step after it, and runs {steps} steps)"
        )
    if request.nproc_per_node is not None and request.nproc_per_node < 1:
        raise TargetError(f"--nproc-per-node {request.nproc_per_node}: give 1 or more")
    if request.backend is not None and request.nproc_per_node is None:
        raise TargetError(
            f"--backend {request.backend} is the backend of runs in several "
            f"processes: add --nproc-per-node N"
        )


def choose_step(records: list[dict[str, Any]]) -> int:
    """The step S to save at: one after which the epoch goes on (mid-epoch), in an epoch
    after the first where the run has one (so that what carries over from one epoch to
    the next is in the checkpoint too), nearest the middle of the run (the earlier of
    two); the middle where every step ends an epoch. ``records``: the straight run's,
    one a step (``records[s - 1]`` is step s's)."""
    middle = max(1, len(records) // 2)
    mid_epoch = [
        s for s in range(1, len(records)) if records[s]["epoch"] == records[s - 1]["epoch"]
    ]
    later = [s for s in mid_epoch if records[s - 1]["epoch"] != records[0]["epoch"]]
    return min(later or mid_epoch or [middle], key=lambda s: (abs(s - middle), s))


@contextlib.contextmanager
def _folder(directory: Path | None) -> Iterator[Path]:
    """Where the runs' files go: ``directory`` (new or empty; kept), else a temporary
    folder, removed after."""
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="runmodel-check-resume-") as made:
            yield Path(made)
        return
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise TargetError(
            f"--dir {directory}: give a new or empty folder (the check's runs "
            f"start from step 0 there)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    yield directory.resolve()


def _checkpoint(folder: Path, at: int) -> Path:
    """The checkpoint the killed run wrote at step ``at``."""
    from .check_resume_child import CHECKPOINTS

    found = [p for p in checkpoints_in(folder / CHECKPOINTS) if position(p)[1] == at]
    if not found:
        raise CheckFailed(
            f"the killed run wrote no checkpoint at step {at} in {folder / CHECKPOINTS}"
        )
    return found[0]


# -- the processes ------------------------------------------------------------------------------


class _Processes:
    """The check's runs, each a process (or torchrun's processes) writing into
    ``folder``; those still running when the check ends are ended."""

    def __init__(self, folder: Path, request: CheckRequest) -> None:
        self.folder, self.nproc = folder, request.nproc_per_node
        self.plan = folder / "plan.json"
        self.running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def __enter__(self) -> _Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for _, process in self.running:
            if process.poll() is None:
                process.terminate()  # torchrun ends its processes on SIGTERM
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    @property
    def ranks(self) -> range:
        return range(self.nproc or 1)

    def start(self, role: str, run_dir: Path, *options: str) -> tuple[str, Any]:
        program = [
            "-m",
            "runmodel.runs.check_resume_child",
            str(self.plan),
            role,
            "--run-dir",
            str(run_dir),
            *options,
        ]
        if self.nproc is not None:
            program = [
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={self.nproc}",
                *program,
            ]
        with open(self.log(role), "wb") as log:
            process = subprocess.Popen(
                [sys.executable, *program],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.running.append((role, process))
        return role, process

    def log(self, role: str) -> Path:
        return self.folder / f"{role}.log"

    def files(self, role: str, rank: int) -> dict[str, Path]:
        from .check_resume_child import files

        return files(self.folder, role, rank)

    def wait(self, started: tuple[str, Any]) -> None:
        """Wait for a run that should end by itself; its failure is raised."""
        role, process = started
        code = process.wait()
        errors = self._errors(role)
        if code == 0 and not errors:
            return
        self._failed(role, code, errors)

    def _errors(self, role: str) -> list[dict[str, Any]]:
        """The errors the run's processes ended with, each with its rank."""
        return [
            {**result, "rank": rank}
            for rank in self.ranks
            if "error" in (result := read_json(self.files(role, rank)["result"]))
        ]

    def wait_killed(self, started: tuple[str, Any], at: int) -> None:
        """Wait for the run that kills itself during step ``at + 1``."""
        role, process = started
        code = process.wait()
        # a process that got to its kill (the checkpoint was on disk) says so; under
        # torchrun the others may be ended by torchrun first, as the first one died
        if code != 0 and any(self.files(role, rank)["killed"].is_file() for rank in self.ranks):
            return
        errors = self._errors(role)
        if code == 0 and not errors:
            steps = len(self.digests(role, 0))
            raise TargetError(
                f"the run ended after {steps} steps, before step {at + 1} "
                f"where the check kills it: give --at below {steps}"
            )
        self._failed(role, code, errors)

    def _failed(self, role: str, code: int, errors: list[dict[str, Any]]) -> None:
        if errors and all(e.get("usage") for e in errors):
            raise TargetError(str(errors[0]["error"]))
        lines = self.log(role).read_text(errors="replace").splitlines()[-TAIL_LINES:]
        if len(errors) > 1:  # each process's own: one's is often the others' going away
            said = "; ".join(f"rank {e['rank']}: {e['error']}" for e in errors)
        else:
            said = errors[0]["error"] if errors else f"its process ended with code {code}"
        raise CheckFailed(
            f"the {role} run failed: {said}\n  its output ended with:\n"
            + "\n".join(f"    {line}" for line in lines)
        )

    def digests(self, role: str, rank: int) -> list[dict[str, Any]]:
        path = self.files(role, rank)["digests"]
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- comparing ----------------------------------------------------------------------------------


def _compare(runs: _Processes, source: str, steps: int, at: int) -> Verdict:
    """The straight run against the killed and the resumed ones, process by process."""
    records = runs.digests("straight", 0)
    verdict = Verdict(
        source,
        steps,
        at,
        _where(records, at),
        processes=len(runs.ranks),
        first_epoch=records[at - 1]["epoch"] == records[0]["epoch"],
    )
    for rank in runs.ranks:
        straight = {r["step"]: r["digest"] for r in runs.digests("straight", rank)}
        resumed = runs.digests("resumed", rank)
        before = _first_differing(straight, runs.digests("killed", rank))
        after = _first_differing(straight, resumed)
        last = resumed[-1]["step"] if resumed else at
        if last != steps:
            verdict.found(
                rank,
                f"the resumed run ended after step {last}, the straight one after step {steps}",
            )
        if before is not None:
            verdict.found(
                rank,
                f"the run does not repeat itself: two runs from the start "
                f"differ after step {before}, before any resume (random "
                f"numbers not seeded alike, loader workers seeded by time, "
                f"nondeterministic operations: "
                f"torch.use_deterministic_algorithms(True) finds those)",
            )
            verdict.first_step = _earliest(verdict.first_step, before)
        elif after is not None:
            verdict.found(
                rank,
                f"first step whose state differs: step {after} "
                + (
                    "(the first after the resume)"
                    if after == at + 1
                    else f"({after - at} after the resume; steps {at + 1}-{after - 1} agree)"
                ),
            )
            verdict.first_step = _earliest(verdict.first_step, after)
        _compare_final(runs, rank, verdict)
    return verdict


def _earliest(known: int | None, step: int) -> int:
    return step if known is None else min(known, step)


def _where(records: list[dict[str, Any]], at: int) -> str:
    """Where step ``at`` sits in its epoch, in words."""
    record = records[at - 1]
    ends = at >= len(records) or records[at]["epoch"] != record["epoch"]
    return (
        f"{'the end of' if ends else 'mid-epoch:'} epoch {record['epoch']}, "
        f"{_ordinal(record['epoch_step'])} step of it"
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _first_differing(straight: dict[int, str], other: list[dict[str, Any]]) -> int | None:
    """The first step of ``other`` whose digest differs from the straight run's."""
    for record in other:
        if straight.get(record["step"]) != record["digest"]:
            return int(record["step"])
    return None


#: The parts of the state compared at the end, in words.
PARTS = {
    "module": "weights",
    "optimizer": "optimizer state",
    "engine": "the engine's own state (counters, the epoch's sums and mean loss)",
    "rng": "random generators",
}


def _compare_final(runs: _Processes, rank: int, verdict: Verdict) -> None:
    """The state the straight and the resumed runs ended with, entry by entry: the
    model's (weights, optimizer state), the engine's own and the random generators'."""
    import torch

    from .check_resume_child import tensor_bytes

    straight, resumed = (
        torch.load(runs.files(role, rank)["final"], weights_only=True)
        for role in ("straight", "resumed")
    )
    names = straight.get("parameters") or []
    ours, theirs = (
        dict(
            [
                *final["model"],
                *(("engine." + k, v) for k, v in final.get("engine", [])),
                *(("rng." + k, v) for k, v in final["rng"]),
            ]
        )
        for final in (straight, resumed)
    )
    parts: dict[str, tuple[int, list[str]]] = {}
    for path in {**ours, **theirs}:
        part = path.partition(".")[0]
        count, differ = parts.get(part, (0, []))
        if (
            path not in ours
            or path not in theirs
            or not _same(ours[path], theirs[path], tensor_bytes)
        ):
            differ.append(path)
        parts[part] = (count + 1, differ)
    for part, (count, differ) in parts.items():
        if differ:
            first = _named(differ[0], names)
            verdict.first_tensor = verdict.first_tensor or first
            verdict.found(
                rank,
                f"{PARTS.get(part, part)}: {len(differ)} of {count} "
                f"{'tensors' if part == 'module' else 'entries'} differ, "
                f"the first {first}",
                "state",
            )


def _same(a: Any, b: Any, tensor_bytes: Callable[[Any], Any]) -> bool:
    """Bit for bit: tensors by dtype, shape and bytes; other values by ``repr`` (a float's
    is exact, and a NaN equals a NaN)."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(tensor_bytes(a), tensor_bytes(b))
        )
    return type(a) is type(b) and repr(a) == repr(b)


def _named(path: str, names: list[str]) -> str:
    """A state entry in words: ``0.weight``, ``exp_avg of 0.weight`` (an optimizer's
    state of a parameter), ``torch (rng.torch)``."""
    part, _, rest = path.partition(".")
    if part == "rng":
        return f"{rest.split('.')[0]} ({path})"
    if part == "optimizer" and rest.startswith("state."):
        index, _, key = rest.removeprefix("state.").partition(".")
        if index.isdigit() and int(index) < len(names):
            return f"{key} of {names[int(index)]}"
    return rest if part == "module" else path


# -- the step again, module by module -----------------------------------------------------------


def _rerun(
    runs: _Processes,
    verdict: Verdict,
    folder: Path,
    saved: Path,
    at: int,
    say: Callable[[str], None],
) -> None:
    """Run the first differing step again in both worlds with forward hooks on every
    module, and name the first module whose output differs (or the batch)."""
    step = verdict.first_step
    assert step is not None
    if step > at:  # after the resume: straight against resumed
        say(f"check-resume: running step {step} again, straight and resumed, module by module")
        first = runs.start("rerun-straight", folder / "rerun-straight", "--record", str(step))
        second = runs.start(
            "rerun-resumed",
            folder / "rerun-resumed",
            "--save-at",
            str(at),
            "--resume",
            str(saved),
            "--record",
            str(step),
        )
        worlds = "the straight and the resumed run"
    else:  # the run does not repeat itself: two straight runs
        say(f"check-resume: running step {step} again, twice from the start, module by module")
        first = runs.start("rerun-straight", folder / "rerun-straight", "--record", str(step))
        second = runs.start("rerun-again", folder / "rerun-again", "--record", str(step))
        worlds = "two runs from the start"
    runs.wait(first)
    runs.wait(second)
    for rank in runs.ranks:
        ours, theirs = (
            read_json(runs.files(role, rank)["outputs"]) for role in (first[0], second[0])
        )
        line, module = _first_module(ours, theirs)
        verdict.found(rank, f"step {step} run again in {worlds}: {line}", "module")
        verdict.module = verdict.module or module


def _first_module(ours: dict[str, Any], theirs: dict[str, Any]) -> tuple[str, str | None]:
    """What differs first in one step of two runs: the batch, a module's output (or its
    input, produced by code between modules), or nothing before the loss."""
    if ours.get("batch") != theirs.get("batch"):
        return (
            "its batch differs: the data loader's order or position is not restored "
            "(a sampler or generator the checkpoint does not hold, or a loader that "
            "cannot be resumed)",
            None,
        )
    agreed: list[str] = []
    for mine, other in zip(ours["calls"], theirs["calls"], strict=False):
        name = _module_name(mine)
        if (mine["module"], mine["type"]) != (other["module"], other["type"]):
            return (
                f"the modules called differ after {len(agreed)} agreed: {name} in one, "
                f"{_module_name(other)} in the other (the forward takes another path)",
                mine["module"],
            )
        if mine["input"] != other["input"]:
            caller = mine["module"].rpartition(".")[0] or "the model's module"
            return (
                f"first module whose input differs: {name}, while the modules before it "
                f"agree: what differs is made in the forward code of {caller} before it "
                f"calls {mine['module']} (a functional op drawing random numbers, such as "
                f"F.dropout or torch.rand?)",
                mine["module"],
            )
        if mine["output"] != other["output"]:
            return (
                f"first module whose output differs: {name}, given the same input"
                + (f" ({len(agreed)} modules before it agree)" if agreed else "")
                + ": it draws random numbers the checkpoint does not restore (a "
                "generator of its own?) or keeps state outside its state_dict",
                mine["module"],
            )
        agreed.append(mine["module"])
    if len(ours["calls"]) != len(theirs["calls"]):
        return ("the modules called differ in number (the forward takes another path)", None)
    return (
        "every module's output agrees, and the batch: what differs comes after the "
        "forward pass (the loss, the backward pass or the optimizer step: an optimizer, "
        "LR schedule, gradient scaler or accumulation state not restored?)",
        None,
    )


def _module_name(call: dict[str, Any]) -> str:
    name = call["module"]
    return f"{name} ({call['type']})" if name else f"the model's module ({call['type']})"
