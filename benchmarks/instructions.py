"""Instructions per step of runmodel's hot path, counted with callgrind, for one checkout
or several side by side (the same script, each checkout's ``runmodel`` on PYTHONPATH).

The work is that of ``overhead.py``: ``nn.Linear(32, 32)``, batch 64, MSE, SGD, one
thread, built with the public API only (``runmodel.Engine``,
``TorchModel.from_parts``), so the script runs on any checkout of the last rounds. The
variants:

* ``train``: ``engine.run(model, steps=N)``, no hooks;
* ``train, 10 hooks``: the same with 10 no-op hooks on ``runstep``;
* ``train, RunLog``: the same with ``runmodel.packs.RunLog`` attached, a reader of the
  loss at each epoch's end (since issue 27 it declares ``reads="loss"``, and a train run
  then sums the epoch's step losses for its mean: per-step work the others do not pay);
* ``eval``: ``engine.run(model, "eval", steps=N)`` (output, loss, the model's metrics);
* issue 39's guards, counted only when named in ``--variants`` (``GUARDS``; older
  checkouts lack the packs): ``train`` with ``NaNGuard()``, ``NaNGuard(every=10)``,
  ``NaNGuard(locate=True)``, ``NaNGuard(locate="exact")`` (a copy of the random
  generators' states at each step's start) or ``SpikeGuard()`` attached (armed after its
  32-step window, within the SHORT region, so the difference counts armed steps only),
  and, as the yardstick of one scalar read, ``train`` with a hook on ``backward`` that
  reads the loss back (``float(engine.state.loss.detach())``);
* for scale, a plain PyTorch train loop and a plain eval loop (``torch.no_grad``) on the
  same work; they do not depend on the checkout.

Each variant runs once to warm up (first-call costs out of the count), then for SHORT and
for LONG steps, each run a region counted by callgrind in the same process; (I(LONG) -
I(SHORT)) / (LONG - SHORT) is one step, with the engine's setup and teardown, the
interpreter's start and the imports cancelled. The counts repeat exactly however busy
the machine is (a run takes a few minutes: a torch import under valgrind is ~2 minutes).

The counting regions come from ``../shared/tools/instructions/`` (``counted.py`` and
``region.c``, which valgrind's client requests switch on and off); that folder is not
part of the repository: give it with ``--tools`` or ``RUNMODEL_INSTRUCTIONS_TOOLS``.
Needs valgrind, gcc and valgrind's headers.

    python benchmarks/instructions.py                          # this checkout
    python benchmarks/instructions.py --checkout /work/wt-base --checkout .  # base vs now
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_TOOLS = HERE.parent.parent / "shared" / "tools" / "instructions"
BATCHES = 64  # distinct batches, reused in turn (the count does not depend on which)
VARIANTS = (
    "plain PyTorch train loop",
    "train",
    "train, 10 hooks on runstep",
    "train, RunLog reading the loss",
    "plain PyTorch eval loop",
    "eval",
)
GUARDS = (
    "train, a hook reading the loss (one scalar read)",
    "train, NaNGuard()",
    "train, NaNGuard(every=10)",
    "train, NaNGuard(locate=True)",
    'train, NaNGuard(locate="exact")',
    "train, SpikeGuard()",
)
RUNMODEL = (
    "train",
    "train, 10 hooks on runstep",
    "train, RunLog reading the loss",
    *GUARDS,
    "eval",
)


# ---- the child: runs under callgrind, counts its regions, prints one JSON line ----


def work() -> tuple[Any, Any, Any, list[Any]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    module = nn.Linear(32, 32)
    batches = [(torch.randn(64, 32), torch.randn(64, 32)) for _ in range(BATCHES)]
    return module, torch.optim.SGD(module.parameters(), lr=0.01), nn.MSELoss(), batches


class Cycle:
    """``steps`` batches, the same few in turn: one epoch as long as the run."""

    def __init__(self, batches: list[Any], steps: int) -> None:
        self.batches, self.steps = batches, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        batches, n = self.batches, len(self.batches)
        return (batches[i % n] for i in range(self.steps))


def plain_train(steps: int) -> None:
    module, optimizer, loss_fn, batches = work()
    for x, y in Cycle(batches, steps):
        loss = loss_fn(module(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def plain_eval(steps: int) -> None:
    import torch

    module, _, loss_fn, batches = work()
    module.eval()
    with torch.no_grad():
        for x, y in Cycle(batches, steps):
            loss_fn(module(x), y)


def with_runmodel(
    mode: str, hooks: int, run_log: bool = False, setup: Callable[[Any], None] | None = None
) -> Callable[[int], None]:
    """``setup(engine)``, when given, attaches or hooks what the variant adds."""

    def run(steps: int) -> None:
        import runmodel
        from runmodel.packs import RunLog

        module, optimizer, loss_fn, batches = work()
        data = Cycle(batches, steps)
        model = runmodel.TorchModel.from_parts(
            module, optimizer=optimizer, loss_fn=loss_fn, train_data=data, eval_data=data
        )
        engine = runmodel.Engine()
        for n in range(hooks):
            engine.on("runstep", lambda engine: None, name=f"noop{n}")
        if run_log:  # one epoch a run: its line is written once, in both regions
            engine.attach(RunLog("run.log"))
        if setup is not None:
            setup(engine)
        engine.run(model, mode, steps=steps)

    return run


def read_loss(engine: Any) -> None:
    float(engine.state.loss.detach())  # one scalar read back, as an armed guard's check does


def guard(pack: str, **options: Any) -> Callable[[Any], None]:
    """Attaches ``runmodel.packs.<pack>(**options)``, imported only when counted."""

    def setup(engine: Any) -> None:
        from runmodel import packs

        engine.attach(getattr(packs, pack)(**options))

    return setup


RUNS: dict[str, Callable[[int], None]] = {
    "plain PyTorch train loop": plain_train,
    "train": with_runmodel("train", 0),
    "train, 10 hooks on runstep": with_runmodel("train", 10),
    "train, RunLog reading the loss": with_runmodel("train", 0, run_log=True),
    "plain PyTorch eval loop": plain_eval,
    "eval": with_runmodel("eval", 0),
    "train, a hook reading the loss (one scalar read)": with_runmodel(
        "train", 0, setup=lambda engine: engine.on("backward", read_loss)
    ),
    "train, NaNGuard()": with_runmodel("train", 0, setup=guard("NaNGuard")),
    "train, NaNGuard(every=10)": with_runmodel("train", 0, setup=guard("NaNGuard", every=10)),
    "train, NaNGuard(locate=True)": with_runmodel("train", 0, setup=guard("NaNGuard", locate=True)),
    'train, NaNGuard(locate="exact")': with_runmodel(
        "train", 0, setup=guard("NaNGuard", locate="exact")
    ),
    "train, SpikeGuard()": with_runmodel("train", 0, setup=guard("SpikeGuard")),
}


def count(
    tools: Path, dumps: str, short: int, long: int, variants: list[str], repeats: int
) -> None:
    """Under callgrind: per variant, the instructions of SHORT and of LONG steps, each a
    counted region (its dump is ``DUMPS.<pid>.<n>``); prints their per-step difference."""
    import torch

    sys.path.insert(0, str(tools))
    from counted import counted  # type: ignore[import-not-found]

    torch.set_num_threads(1)
    import runmodel

    with counted():  # the first region pays for the counting's own first calls
        plain_train(1)
    region, per_step, totals = 1, {}, {}
    for name in variants:
        run = RUNS[name]
        run(short)  # warm: lazy imports and first calls out of the count
        counts, steps_of = [], []
        for _ in range(repeats):
            for steps in (short, long):
                # a full collection of torch's heap costs millions of instructions, at
                # moments no step chooses: freeze what exists, so a collection in the
                # region sees only what the region made
                gc.collect()
                gc.freeze()
                with counted():
                    run(steps)
                region += 1
                text = Path(f"{dumps}.{os.getpid()}.{region}").read_text()
                counts.append(
                    int(
                        next(
                            line for line in text.splitlines() if line.startswith("totals:")
                        ).split()[1]
                    )
                )
            steps_of.append((counts[-1] - counts[-2]) / (long - short))
        totals[name] = counts
        per_step[name] = steps_of
    print(json.dumps({"runmodel": runmodel.__file__, "per_step": per_step, "totals": totals}))


# ---- the parent: launches the child under valgrind once per checkout ----


def tools_folder(given: str | None) -> Path:
    folder = Path(given or os.environ.get("RUNMODEL_INSTRUCTIONS_TOOLS") or DEFAULT_TOOLS)
    if not (folder / "counted.py").is_file() or not (folder / "region.c").is_file():
        sys.exit(
            f"instructions.py: no counted.py and region.c in {folder}: give the folder "
            f"of the instruction-counting tools (../shared/tools/instructions in the "
            f"project's workspace) with --tools DIR or RUNMODEL_INSTRUCTIONS_TOOLS"
        )
    missing = [tool for tool in ("valgrind", "gcc") if shutil.which(tool) is None]
    if missing or not Path("/usr/include/valgrind/callgrind.h").is_file():
        sys.exit(
            f"instructions.py: needs valgrind, gcc and valgrind's headers "
            f"(/usr/include/valgrind/callgrind.h); missing: "
            f"{', '.join(missing) or 'callgrind.h'}"
        )
    return folder


def measure(
    checkout: Path,
    tools: Path,
    short: int,
    long: int,
    variants: list[str],
    repeats: int,
    keep: Path | None,
) -> dict[str, Any]:
    """One callgrind process with ``checkout`` first on PYTHONPATH; its dumps are kept
    in ``keep`` (for ``callgrind_annotate``) when given."""
    with tempfile.TemporaryDirectory(prefix="instructions-") as folder:
        if keep is not None:
            folder = str(keep.resolve() / checkout.name)
            os.makedirs(folder, exist_ok=True)
        dumps = f"{folder}/cg"
        env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
        command = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            f"--callgrind-out-file={dumps}.%p",
            sys.executable,
            __file__,
            "--child",
            "--tools",
            str(tools),
            "--dumps",
            dumps,
            "--short",
            str(short),
            "--long",
            str(long),
            "--repeats",
            str(repeats),
            "--variants",
            json.dumps(variants),
        ]
        done = subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(
                f"instructions.py: the count in {checkout} failed "
                f"(exit {done.returncode}):\n{done.stderr[-4000:]}"
            )
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result


def commit_of(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=%h %s"], capture_output=True, text=True
    )
    return done.stdout.strip()[:70] if done.returncode == 0 else "(not a git checkout)"


def machine() -> str:
    name = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
    return (
        f"{name} ({os.cpu_count()} cores), {platform.system()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}, "
        f"{valgrind.stdout.strip()}, 1 thread"
    )


def median(values: list[float]) -> float:
    return statistics.median(values)


def report(
    checkouts: list[Path], results: list[dict[str, Any]], short: int, long: int, variants: list[str]
) -> None:
    print(
        f"{time.strftime('%Y-%m-%d')}, {machine()}; instructions per step = "
        f"(I({long} steps) - I({short} steps)) / {long - short}\n"
    )
    for number, (checkout, result) in enumerate(zip(checkouts, results, strict=True)):
        print(
            f"[{number}] {checkout}: {commit_of(checkout)} (runmodel from "
            f"{Path(result['runmodel']).parent})"
        )
    header = "| variant | " + " | ".join(f"[{n}]" for n in range(len(checkouts)))
    header += "".join(f" | [{n}] vs [0]" for n in range(1, len(checkouts)))
    print(f"\n{header} |\n|---|" + "---:|" * (2 * len(checkouts) - 1))
    for name in variants:
        counts = [median(result["per_step"][name]) for result in results]
        row = f"| {name} | " + " | ".join(f"{n:,.0f}" for n in counts)
        row += "".join(f" | {n - counts[0]:+,.0f} ({n / counts[0] - 1:+.3%})" for n in counts[1:])
        print(row + " |")
    for number, result in enumerate(results):
        spreads = {name: (max(v) - min(v)) / median(v) for name, v in result["per_step"].items()}
        worst = max(spreads, key=spreads.__getitem__)
        print(
            f"\n[{number}]: the {len(result['per_step'][worst])} repeats of each variant "
            f"agree within {spreads[worst]:.3%} ({worst}: "
            f"{', '.join(f'{n:,.0f}' for n in result['per_step'][worst])})",
            end="",
        )
    print()
    plain = {
        "train": "plain PyTorch train loop",
        "train, 10 hooks on runstep": "plain PyTorch train loop",
        "train, RunLog reading the loss": "plain PyTorch train loop",
        **dict.fromkeys(GUARDS, "plain PyTorch train loop"),
        "eval": "plain PyTorch eval loop",
    }
    rows = [name for name in RUNMODEL if name in variants and plain[name] in variants]
    if rows:
        print(
            "\nrunmodel's own share (the variant less the plain loop of the same checkout's run):\n"
        )
        print(
            f"| variant | {' | '.join(f'[{n}]' for n in range(len(checkouts)))} |\n|---|"
            + "---:|" * len(checkouts)
        )
        for name in rows:
            own = [
                median(r["per_step"][name]) - median(r["per_step"][plain[name]]) for r in results
            ]
            print(f"| {name} | " + " | ".join(f"{n:+,.0f}" for n in own) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkout",
        action="append",
        type=Path,
        help="a checkout whose runmodel to count (repeat to compare; the "
        "first is the reference); default: this script's checkout",
    )
    parser.add_argument(
        "--tools",
        help=f"the counting tools' folder (default: "
        f"$RUNMODEL_INSTRUCTIONS_TOOLS or {DEFAULT_TOOLS})",
    )
    parser.add_argument("--short", type=int, default=100, help="steps of the short region")
    parser.add_argument("--long", type=int, default=400, help="steps of the long region")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="pairs of regions per variant (their counts should agree)",
    )
    parser.add_argument(
        "--variants",
        default=json.dumps(list(VARIANTS)),
        help="a JSON list of the variants to count (default: all but issue 39's guards)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep callgrind's dumps in KEEP/<checkout>/"
        " (region n of the run: cg.<pid>.<n>), to annotate them",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dumps", help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = json.loads(args.variants)
    unknown = [name for name in variants if name not in RUNS]
    if unknown or not variants:
        sys.exit(f"instructions.py: unknown variants {unknown}; known: {list(RUNS)}")
    if not 0 < args.short < args.long:
        sys.exit(f"instructions.py: needs 0 < --short < --long, got {args.short}, {args.long}")
    if args.child:
        count(Path(args.tools), args.dumps, args.short, args.long, variants, args.repeats)
        return
    tools = tools_folder(args.tools)
    checkouts = [path.resolve() for path in args.checkout or [HERE.parent]]
    for checkout in checkouts:
        if not (checkout / "runmodel" / "__init__.py").is_file():
            sys.exit(f"instructions.py: {checkout} holds no runmodel package")
    results = []
    for checkout in checkouts:  # one at a time: callgrind is slow, and the cores are shared
        print(f"counting {checkout} ...", file=sys.stderr, flush=True)
        results.append(
            measure(checkout, tools, args.short, args.long, variants, args.repeats, args.keep)
        )
    report(checkouts, results, args.short, args.long, variants)


if __name__ == "__main__":
    main()
