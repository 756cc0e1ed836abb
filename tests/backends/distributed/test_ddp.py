"""The ddp backend in real processes: torchrun starts 2 on the CPU (gloo), through
``runmodel run SOURCE --nproc-per-node 2`` and through ``torchrun script.py``.

Launching costs seconds, so the runs are made once per module and shared: a straight
2-process training (checkpoints every 5 steps, Evaluate, TensorBoard, a run log), a run
resumed from one of its mid-epoch checkpoints, a run whose rank 1 fails, one whose rank
1 is killed, the same training preempted by SIGTERM to torchrun in mid-epoch (then
resumed in 2 processes, and in 1), and one whose rank 1 is killed under torchrun's
``--max-restarts 1``. The straight run is the reference of every bit-for-bit check; it
is checked itself against the same training in this process, one process with batches
twice as large drawn in the order the two processes' samplers deal out. Where launches
need not be apart, one launch runs several in turn: the resumes of the straight and the
killed run; the two 1-process resumes of the preempted run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Sampler

import runmodel
from runmodel.backends import DDP
from runmodel.checkpoint import checkpoints_in
from runmodel.checkpoint import load as load_checkpoint

import warm as subprocess
from helpers import with_child_net
from launching import sections, torchrun_args, wait_for

EPOCHS, BATCH = 3, 4  # per process: 64 samples / 2 processes / 4 = 8 steps an epoch
#: A run that hangs fails the test here rather than never ending.
LIMIT_S = 240

MODEL = with_child_net(
    textwrap.dedent('''
    """A small classifier, and the hooks the ddp tests look at."""
    import os
    import signal
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.packs import Checkpoint, Evaluate, RunLog, TensorBoard

    N, EVAL_N, FEATURES, CLASSES = 64, 37, 8, 3  # 37: the eval split is uneven, 19 + 18


    CHILD_NET


    _datasets = datasets


    def datasets():
        """Each training sample carries its index (a third tensor, which the model does not
        read), so that a test can tell which samples each step trained on."""
        train, test = _datasets()
        return TensorDataset(*train.tensors, torch.arange(N)), test


    def configure(engine, out="."):
        out = os.path.abspath(out)  # here, not in the run folder `runmodel run` gives it
        rank = os.environ.get("RANK", "?")
        os.makedirs(out, exist_ok=True)
        if os.environ.get("FAIL_AT_STEP"):  # (the packs' imports cost seconds)
            @engine.on("step_start", rank=1, once=int(os.environ["FAIL_AT_STEP"]))
            def fail(engine):
                raise RuntimeError(f"rank 1 fails on purpose at step {engine.state.step}")
        else:
            # the first attempt only: torchrun's restart (--max-restarts) goes on
            if os.environ.get("KILL_AT_STEP") and os.environ.get(
                    "TORCHELASTIC_RESTART_COUNT", "0") == "0":
                @engine.on("step_start", rank=1, once=int(os.environ["KILL_AT_STEP"]))
                def die(engine):  # as the OOM killer or a lost machine would end it
                    with open(f"{out}/killed-at", "w") as f:
                        f.write(repr(time.time()))
                    os.kill(os.getpid(), signal.SIGKILL)

                if os.environ.get("SIGNALLED_BEFORE_RECORD"):
                    @engine.on("exception", rank=0, priority=20_000)  # before the backend's
                    def slow(engine):  # torchrun's SIGTERM comes before the record is written
                        time.sleep(60)

            if os.environ.get("PREEMPT_AT_STEP"):
                @engine.on("step_start", rank=0, once=int(os.environ["PREEMPT_AT_STEP"]))
                def preempted_here(engine):  # wait here until this process got the signal
                    from runmodel.backends.distributed.stopping import REQUEST

                    with open(f"{out}/ready", "w") as f:
                        f.write(str(engine.state.step))
                    while not REQUEST.signal:
                        time.sleep(0.02)

            if os.environ.get("RECORD_INDICES"):
                @engine.on("runstep")
                def indices(engine):
                    with open(f"{out}/indices-{rank}", "a") as f:
                        f.write(f"{engine.state.epoch} {engine.state.batch[2].tolist()}\\n")

            @engine.on("teardown")
            def stopped(engine):
                with open(f"{out}/stopped-{rank}", "w") as f:
                    f.write(f"{engine.state.step} {engine.state.stopping}")

            engine.attach(Evaluate(), Checkpoint(f"{out}/ckpt", every="5st", keep=None),
                          RunLog(f"{out}/run.log"))
            if out == os.getcwd():  # the straight run
                engine.attach(TensorBoard(f"{out}/tb"))

        @engine.on("setup")
        def every_rank(engine):
            with open(f"{out}/setup-{rank}", "w") as f:
                f.write(f"{engine.state.rank} {os.environ.get('WORLD_SIZE')}")

        @engine.on("epoch_start", rank=1)
        def rank_1_only(engine):
            with open(f"{out}/rank-1-hook", "a") as f:
                f.write(f"{rank}\\n")

        @engine.on("teardown", rank=0)
        def final_weights(engine):
            if engine.state.error is None:
                torch.save(engine.model.state_dict()["module"], f"{out}/final.pt")

''')
)

RESUME = textwrap.dedent('''
    """Started by torchrun itself: resume the straight run from a checkpoint (a path), or
    a run in this folder from its newest one ("auto"); then, in the same script, an eval
    run of the trained model."""
    import json
    import os
    import sys

    import torch

    import runmodel
    from net import Net, configure



    def resume(checkpoint):
        engine = runmodel.Engine()
        configure(engine, out="resumed" if checkpoint != "auto" else ".")
        model = Net()
        torch.manual_seed(12345)  # the checkpoint sets the generators and the sampler's seed
        result = engine.run(model, epochs=3, backend="ddp", resume=checkpoint)
        evaluated = runmodel.Engine().run(model, mode="eval", backend="ddp")
        if os.environ["RANK"] == "0":
            print(f"resumed: {result.ended} after {result.steps} steps")
            print("then evaluated:", json.dumps({"metrics": evaluated.metrics,
                                                 "module": type(model.module).__name__}),
                  flush=True)


    # resume.py CHECKPOINT, or resume.py FOLDER CHECKPOINT ...: each resumed in turn, from
    # its folder (its output after a line "=== run FOLDER ===" on stdout and stderr)
    if len(sys.argv) == 2:
        resume(sys.argv[1])
    for folder, checkpoint in zip(sys.argv[1::2], sys.argv[2::2]):
        os.chdir(folder)
        if os.environ["RANK"] == "0":
            for stream in (sys.stdout, sys.stderr):
                print(f"=== run {folder} ===", file=stream, flush=True)
        resume(checkpoint)
''')


TRAIN = textwrap.dedent('''
    """Started by torchrun: the straight run's training in a run folder ("run"), watching
    SIGTERM, the processes checking for a signal every 3 steps; it continues from its
    newest checkpoint (resume="auto"), or from the checkpoint given."""
    import os
    import sys

    from torch.utils.data import DataLoader, DistributedSampler

    import runmodel
    from net import Net, configure
    from runmodel.backends import DDP


    class OwnSampler(Net):
        """Net, with a DistributedSampler of its own: the backend keeps it as it is."""

        def setup(self, setup_options=None):
            super().setup(setup_options)
            dataset = self.train_data.dataset
            self.train_data = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(
                dataset, num_replicas=int(os.environ["WORLD_SIZE"]),
                rank=int(os.environ["RANK"])))




    def train(resume):
        engine = runmodel.Engine()
        configure(engine, out=os.getcwd())
        model = OwnSampler() if os.environ.get("OWN_SAMPLER") else Net()
        engine.run(model, epochs=3, backend=DDP(preempt_check_every=3), run_dir="run",
                   resume=resume, preempt_signals=("SIGTERM",))


    if sys.argv[1:2] == ["--each"]:
        # train.py --each CHECKPOINT FOLDER[:NAME] ...: resumed in each folder in turn
        # (NAME=1 in the environment), its output after a line "=== run FOLDER ===" on stderr
        for where in sys.argv[3:]:
            folder, _, name = where.partition(":")
            os.chdir(folder)
            if name:
                os.environ[name] = "1"
            if os.environ["RANK"] == "0":
                print(f"=== run {folder} ===", file=sys.stderr, flush=True)
            train(sys.argv[2])
            os.environ.pop(name, None)
    else:
        train(sys.argv[1] if len(sys.argv) > 1 else "auto")
''')


def torchrun_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    env.pop("TORCHELASTIC_RUN_ID", None)
    return env


def launch(args: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        args,
        cwd=cwd,
        env=torchrun_env(**env),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # killed with its processes


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str, float]:
    started = time.monotonic()
    try:
        out, err = process.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the launch did not end within {LIMIT_S}s:\n{err[-3000:]}")
    return process.returncode, out, err, time.monotonic() - started


class Runs:
    """The launches, made once: started together (the resumed run as soon as the straight
    run's checkpoint is on disk), awaited when a test needs one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "net.py").write_text(MODEL)
        (root / "resume.py").write_text(RESUME)
        (root / "train.py").write_text(TRAIN)
        self.straight_dir, self.failing_dir = root / "straight", root / "failing"
        self.killed_dir, self.restarted_dir = root / "killed", root / "restarted"
        self.preempted_dir, self.one_dir = root / "preempted", root / "in-one-process"
        self.own_sampler_dir = root / "own-sampler"
        for folder in (
            self.straight_dir,
            self.failing_dir,
            self.killed_dir,
            self.restarted_dir,
            self.preempted_dir,
            self.one_dir,
            self.own_sampler_dir,
        ):
            folder.mkdir()
        cli = [
            sys.executable,
            "-m",
            "runmodel",
            "run",
            str(root / "net.py"),
            "--nproc-per-node",
            "2",
            "--epochs",
            str(EPOCHS),
            "--no-progress",
        ]
        self._straight = launch([*cli, "--json"], self.straight_dir)
        self._failing = launch(cli, self.failing_dir, FAIL_AT_STEP="3")
        self._killed = launch(cli, self.killed_dir, KILL_AT_STEP="12")
        self._cache: dict[str, Any] = {}
        self._later: list[subprocess.Popen[str]] = []
        self._restarted: subprocess.Popen[str] | None = None
        self._restart_started = threading.Event()
        self._closing = False
        # once the killed run ended (how soon it ends is measured: no more load before)
        self._preempting = threading.Thread(target=self._restart_and_preempt, daemon=True)
        self._preempting.start()
        self._resume: subprocess.Popen[str] | None = None
        self._resume_starter = threading.Thread(target=self._start_resume, daemon=True)
        self._resume_starter.start()

    def _start_resume(self) -> None:
        """One launch resumes, in turn, the straight run from its mid-epoch checkpoint (as
        soon as it is on disk) and the killed run from its newest (once it ended)."""
        checkpoint = self.straight_dir / "ckpt" / self.mid_epoch_checkpoint()
        deadline = time.monotonic() + LIMIT_S
        while (
            not checkpoint.exists()
            and self._straight.poll() is None
            and (time.monotonic() < deadline)
        ):
            time.sleep(0.1)  # checkpoints are renamed into place: there means complete
        while self._killed.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self._cache["killed_checkpoints"] = [  # before the resume saves there again
            c.name for c in reversed(checkpoints_in(self.killed_dir / "ckpt"))
        ]
        if not checkpoint.exists() or self._closing:
            return
        path = os.pathsep.join(filter(None, [str(self.root), os.environ.get("PYTHONPATH")]))
        self._resume = launch(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                str(self.root / "resume.py"),
                *(str(self.straight_dir), str(checkpoint)),
                *(str(self.killed_dir), "auto"),
            ],
            self.straight_dir,
            PYTHONPATH=path,
        )

    def _await_resumes(self) -> None:
        """The launch of the two resumes: each one's part of its output."""
        if "resumed" in self._cache:
            return
        self._resume_starter.join()
        assert self._resume is not None, "the straight run wrote no step-10 checkpoint"
        code, out, err, took = finish(self._resume)
        outs, errs = sections(out), sections(err)
        for name, folder in (("resumed", self.straight_dir), ("killed_resumed", self.killed_dir)):
            self._cache[name] = (code, outs.get(str(folder), out), errs.get(str(folder), err), took)

    def train(
        self, cwd: Path, *options: str, processes: int = 2, args: tuple[str, ...] = (), **env: str
    ) -> subprocess.Popen[str]:
        """train.py under torchrun, from ``cwd`` (its run folder is ``cwd/run``)."""
        path = os.pathsep.join(filter(None, [str(self.root), os.environ.get("PYTHONPATH")]))
        return launch(
            torchrun_args(self.root / "train.py", *args, processes=processes, options=options),
            cwd,
            PYTHONPATH=path,
            **env,
        )

    def _restart_and_preempt(self) -> None:
        """Once the killed run ended: the run whose rank 1 is killed under torchrun's
        --max-restarts 1, and beside it the preempted run (then its resumes)."""
        deadline = time.monotonic() + LIMIT_S
        while self._killed.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self._cache["killed_exited"] = time.time()  # when it ended, not when a test asked
        try:
            if not self._closing:
                self._restarted = self.train(
                    self.restarted_dir,
                    "--max-restarts",
                    "1",
                    KILL_AT_STEP="12",
                    SIGNALLED_BEFORE_RECORD="1",
                )
        finally:
            self._restart_started.set()
        if not self._closing:
            self._preempt()

    def _preempt(self) -> None:
        """SIGTERM to torchrun once rank 0 is at step 9 (mid-epoch 1); rank 0 waits there
        until its handler recorded the signal, so the processes' first check after it is
        the one after step 11 (they check every 3 steps): the run stops at step 12. Then
        it is resumed, in 2 processes, and from its step-12 checkpoint in 1."""
        folder = self.preempted_dir
        process = self.train(
            folder, "--shutdown-timeout", str(LIMIT_S), PREEMPT_AT_STEP="9", RECORD_INDICES="1"
        )
        self._later.append(process)
        wait_for(folder / "ready", process, LIMIT_S)
        process.send_signal(signal.SIGTERM)
        self._cache["preempted"] = finish(process)
        self._cache["preempted_checkpoints"] = [
            c.name for c in reversed(checkpoints_in(folder / "ckpt"))
        ]
        # what the processes and the run folder said, before the resume writes there again
        self._cache["preempted_stopped"] = [
            (folder / f"stopped-{rank}").read_text()
            if (folder / f"stopped-{rank}").exists()
            else None
            for rank in (0, 1)
        ]
        self._cache["preempted_status"] = json.loads((folder / "run" / "status.json").read_text())
        checkpoint = folder / "ckpt" / "ckpt-00001-0000000012.pt"
        if self._closing:
            return
        resumed = self.train(folder)
        # in 1 process, one launch: the run dealt out anew, then the one refused (last: the
        # launch's exit code is its own)
        each = (f"{self.one_dir}:RECORD_INDICES", f"{self.own_sampler_dir}:OWN_SAMPLER")
        one = self.train(self.one_dir, processes=1, args=("--each", str(checkpoint), *each))
        self._later += [resumed, one]
        self._cache["preempted_resumed"] = finish(resumed)
        code, out, err, took = finish(one)
        parts = sections(err)
        went_on = str(self.own_sampler_dir) in parts  # the first ended without an error
        self._cache["in_one_process"] = (
            0 if went_on else code,
            out,
            parts.get(str(self.one_dir), err),
            took,
        )
        self._cache["own_sampler"] = (code, out, parts.get(str(self.own_sampler_dir), err), took)

    def preempted(self, name: str = "preempted") -> tuple[int, str, str, float]:
        """The preempted launch (``name``), its resume in 2 processes
        (``preempted_resumed``), and in 1 (``in_one_process``)."""
        self._preempting.join(timeout=4 * LIMIT_S)
        assert name in self._cache, f"the {name} launch did not end"
        result: tuple[int, str, str, float] = self._cache[name]
        return result

    def restarted(self) -> tuple[int, str, str, float]:
        if "restarted" not in self._cache:
            self._restart_started.wait(timeout=2 * LIMIT_S)
            assert self._restarted is not None, "the restarted run did not start"
            self._cache["restarted"] = finish(self._restarted)
        result: tuple[int, str, str, float] = self._cache["restarted"]
        return result

    def straight(self) -> tuple[int, str, str, float]:
        if "straight" not in self._cache:
            self._cache["straight"] = finish(self._straight)
            code, _, err, _ = self._cache["straight"]
            assert code == 0, err[-4000:]
        result: tuple[int, str, str, float] = self._cache["straight"]
        return result

    def failing(self) -> tuple[int, str, str, float]:
        if "failing" not in self._cache:
            self._cache["failing"] = finish(self._failing)
        result: tuple[int, str, str, float] = self._cache["failing"]
        return result

    def _await_killed(self) -> None:
        self._cache["killed_finished"] = finish(self._killed)
        self._cache["killed_ended"] = time.time()  # communicate() returned at its exit

    def killed(self) -> tuple[int, str, str, float]:
        """Rank 1 SIGKILLed at step 12 (after the step-10 checkpoint), then the run
        resumed in the same folder with resume="auto": the launch that was killed."""
        if "killed" not in self._cache:
            self._cache["killed"] = finish(self._killed)
            self._await_resumes()
        result: tuple[int, str, str, float] = self._cache["killed"]
        return result

    def resumed(self) -> tuple[int, str, str, float]:
        self.straight()
        self._await_resumes()
        result: tuple[int, str, str, float] = self._cache["resumed"]
        assert result[0] == 0, result[2][-4000:]
        return result

    @staticmethod
    def mid_epoch_checkpoint() -> str:
        return "ckpt-00001-0000000010.pt"  # step 10: epoch 1, 2 of its 8 steps done

    def close(self) -> None:
        self._resume_starter.join()
        self._closing = True  # the preemption's thread starts nothing more
        for process in (self._straight, self._failing, self._killed, self._resume, self._restarted):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        for process in self._later:  # their thread reads what is left
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        self._preempting.join(timeout=LIMIT_S)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    made = Runs(tmp_path_factory.mktemp("ddp"))
    try:
        yield made
    finally:
        made.close()


def net_module(root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddp_test_net", root / "net.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class DealtOrder(Sampler[int]):
    """One process's view of what 2 DistributedSamplers deal out: epoch e's permutation
    (``randperm`` from ``seed + e``), in order; a batch of 2b of it is the union of the
    processes' batches of b."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=g).tolist())

    def __len__(self) -> int:
        return self.size


def one_process_reference(root: Path, seed: int) -> Any:
    """The same training in one process, batch 2b, the dealt order: the trained model."""
    net = net_module(root)
    sampler = DealtOrder(net.N, seed)

    class Reference(net.Net):  # type: ignore[misc, name-defined]
        def setup(self, setup_options: Any = None) -> None:
            super().setup({"batch_size": 2 * BATCH})
            self.train_data = DataLoader(
                self.train_data.dataset, batch_size=2 * BATCH, sampler=sampler
            )

    engine = runmodel.Engine()
    engine.on("epoch_start", lambda engine: setattr(sampler, "epoch", engine.state.epoch))
    model = Reference("cpu")
    result = engine.run(model, epochs=EPOCHS)
    assert result.steps == EPOCHS * net.N // (2 * BATCH)
    return model


def sampler_seed(checkpoint: Path) -> int:
    return int(load_checkpoint(checkpoint)[1]["engine"]["packs"]["ddp"]["seed"])


# -- training ----------------------------------------------------------------------------


def test_two_processes_with_batch_b_train_as_one_with_batch_2b(runs: Runs) -> None:
    _, out, _, _ = runs.straight()
    result = json.loads(out)
    assert (result["ended"], result["steps"], result["epochs"]) == ("completed", 24, EPOCHS)
    trained = torch.load(runs.straight_dir / "final.pt", weights_only=True)
    seed = sampler_seed(runs.straight_dir / "ckpt" / "ckpt-00002-0000000020.pt")
    reference = one_process_reference(runs.root, seed)
    expected = reference.module.state_dict()
    assert trained.keys() == expected.keys()
    initial = net_module(runs.root).Net("cpu").module.state_dict()
    for name, value in trained.items():
        assert not torch.equal(value, initial[name]), f"{name} did not train"
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-5, msg=name)


def test_each_process_reads_its_own_half_of_every_epoch(runs: Runs) -> None:
    """The checkpoints record the sampler's seed; the orders the two processes draw from
    it, epoch by epoch, split the data without overlap (set_epoch reshuffles)."""
    runs.straight()
    from torch.utils.data import DistributedSampler

    seed = sampler_seed(runs.straight_dir / "ckpt" / "ckpt-00000-0000000005.pt")
    orders = []
    for epoch in range(EPOCHS):
        halves = []
        for rank in (0, 1):
            sampler = DistributedSampler(range(64), num_replicas=2, rank=rank, seed=seed)
            sampler.set_epoch(epoch)
            halves.append(list(sampler))
        assert sorted(halves[0] + halves[1]) == list(range(64))
        orders.append(halves[0])
    assert orders[0] != orders[1] != orders[2]


def test_setup_hooks_ran_on_both_ranks_and_rank_1_hooks_on_rank_1_only(runs: Runs) -> None:
    runs.straight()
    folder = runs.straight_dir
    assert (folder / "setup-0").read_text() == "0 2"
    assert (folder / "setup-1").read_text() == "1 2"
    assert (folder / "rank-1-hook").read_text().split() == ["1"] * EPOCHS


# -- rank 0 only -------------------------------------------------------------------------


def test_checkpoints_tensorboard_and_run_log_are_written_by_rank_0_alone(runs: Runs) -> None:
    _, out, _, _ = runs.straight()
    metrics = json.loads(out)["metrics"]
    folder = runs.straight_dir
    assert [c.name for c in reversed(checkpoints_in(folder / "ckpt"))] == [
        f"ckpt-{step // 8:05d}-{step:010d}.pt" for step in (5, 10, 15, 20)
    ]
    log = (folder / "run.log").read_text().splitlines()
    assert [line.split(" ", 2)[2].split(" loss")[0] for line in log] == [
        "start train: 0 epochs, 0 steps done",
        "epoch 1 step 8",
        "epoch 2 step 16",
        "epoch 3 step 24",
        "end: 3 epochs, 24 steps done",
    ]
    events = list((folder / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1, events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(events[0]))
    accumulator.Reload()
    accuracy = accumulator.Scalars("train/eval_accuracy")
    assert [e.step for e in accuracy] == [8, 16, 24]
    assert accuracy[-1].value == pytest.approx(metrics["eval_accuracy"], abs=1e-6)


# -- evaluation ----------------------------------------------------------------------------


def test_eval_metrics_add_up_across_processes_to_the_whole_eval_set(runs: Runs) -> None:
    """The 37 eval samples split 19 + 18 (no padding, no sample twice), and ignite's
    metrics add the processes' counts: the 2-process values are the 1-process ones of
    the same weights."""
    _, out, _, _ = runs.straight()
    metrics = json.loads(out)["metrics"]
    model = net_module(runs.root).Net("cpu")
    model.setup()
    model.module.load_state_dict(torch.load(runs.straight_dir / "final.pt", weights_only=True))
    whole = runmodel.evaluate(model)
    assert metrics["eval_accuracy"] == pytest.approx(whole["accuracy"], abs=1e-9)
    assert metrics["eval_loss"] == pytest.approx(whole["loss"], rel=1e-6)
    # a metric of one process's part, or of a padded split, would differ from this
    assert round(whole["accuracy"] * 37) == pytest.approx(whole["accuracy"] * 37, abs=1e-6)


# -- resume -------------------------------------------------------------------------------


def test_a_checkpoint_of_the_two_process_run_resumes_to_the_same_weights(runs: Runs) -> None:
    """Resumed mid-epoch (step 10 of 24, epoch 1) by a script that torchrun started, with
    torch's generator seeded otherwise: the checkpoint gives the sampler's seed, the
    position in the epoch and the generators back."""
    _, out, err, _ = runs.resumed()
    assert "resumed: completed after 24 steps" in out, err[-3000:]
    straight = torch.load(runs.straight_dir / "final.pt", weights_only=True)
    resumed = torch.load(runs.straight_dir / "resumed" / "final.pt", weights_only=True)
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name
    log = (runs.straight_dir / "resumed" / "run.log").read_text().splitlines()
    assert "start train: 1 epoch, 10 steps done" in log[0]


def test_after_the_run_the_same_script_evaluates_the_trained_model(runs: Runs) -> None:
    """The process group the backend made lives on after the run: the script's eval run
    (``backend="ddp"`` again) wraps the module for its own run only and gives the metrics
    of the whole eval set, those the straight run's last evaluation had (the resumed
    run's weights are the straight run's, bit for bit)."""
    _, out, _, _ = runs.resumed()
    line = next(line for line in out.splitlines() if line.startswith("then evaluated: "))
    after = json.loads(line.removeprefix("then evaluated: "))
    assert after["module"] == "Sequential"  # the model's own module back, not wrapped
    trained = json.loads(runs.straight()[1])["metrics"]
    assert after["metrics"]["accuracy"] == pytest.approx(trained["eval_accuracy"], abs=1e-9)
    assert after["metrics"]["loss"] == pytest.approx(trained["eval_loss"], rel=1e-6)


# -- failures -------------------------------------------------------------------------------


def test_an_error_in_rank_1_ends_both_processes_and_is_reported(runs: Runs) -> None:
    code, out, err, _ = runs.failing()
    assert code == 1, err[-3000:]
    assert out == ""  # no result printed
    assert (
        "runmodel run: error: process rank 1 failed: RuntimeError: rank 1 "
        "fails on purpose at step 3; every process was ended"
    ) in err
    # rank 1's own report, with where it was raised
    assert "runmodel run [rank 1]: error: RuntimeError: rank 1 fails on purpose at step 3" in err
    assert "raised in phase 'step_start', hook 'fail'" in err
    # rank 0's own error, on the lost connection, says where it came from
    assert "runmodel: rank 1 failed first: RuntimeError: rank 1 fails on purpose at step 3" in err
    # rank 0 went no further than the step rank 1 never reached
    assert not (runs.failing_dir / "final.pt").exists()
    assert (runs.failing_dir / "setup-0").exists() and (runs.failing_dir / "setup-1").exists()


def test_a_killed_rank_ends_the_run_in_seconds_naming_it_and_auto_resume_is_exact(
    runs: Runs,
) -> None:
    """Rank 1 is SIGKILLed at step 12: rank 0 fails on the lost connection at once, the
    launcher ends with 1 naming rank 1, and resume="auto" finishes the run from its step-10
    checkpoint with the straight run's weights, bit for bit."""
    code, _, err, _ = runs.killed()
    runs._restart_started.wait(timeout=2 * LIMIT_S)
    ended = runs._cache["killed_exited"]  # noted as it ended, not when this test came
    assert code == 1, err[-3000:]
    assert "runmodel run: error: process rank 1 failed (killed by SIGKILL)" in err, err[-3000:]
    killed_at = float((runs.killed_dir / "killed-at").read_text())
    assert ended - killed_at < 20, f"the run took {ended - killed_at:.1f}s to end"
    assert runs._cache["killed_checkpoints"] == [
        "ckpt-00000-0000000005.pt",
        "ckpt-00001-0000000010.pt",
    ]
    resumed_code, _, resumed_err, _ = runs._cache["killed_resumed"]
    assert resumed_code == 0, resumed_err[-3000:]
    assert "resuming from" in resumed_err and "ckpt-00001-0000000010.pt" in resumed_err
    runs.straight()
    straight = torch.load(runs.straight_dir / "final.pt", weights_only=True)
    resumed = torch.load(runs.killed_dir / "final.pt", weights_only=True)
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


# -- preemption and restarts -----------------------------------------------------------------


def test_sigterm_to_torchrun_stops_every_process_at_one_step_and_the_resume_is_exact(
    runs: Runs,
) -> None:
    """SIGTERM to the launcher, which sends it on to both processes: each handler records
    it, the processes' next check (after step 11) stops both after step 12 (mid-epoch 1),
    the Checkpoint pack saves that step, the run folder says preempted; run again, the
    run ends with the straight run's weights, bit for bit."""
    _, _, err, _ = runs.preempted()
    folder = runs.preempted_dir
    assert (folder / "ready").read_text() == "9"
    assert runs._cache["preempted_stopped"] == ["12 preempted"] * 2, err[-3000:]
    assert runs._cache["preempted_checkpoints"] == [
        "ckpt-00000-0000000005.pt",
        "ckpt-00001-0000000010.pt",
        "ckpt-00001-0000000012.pt",
    ]
    assert err.count("runmodel: SIGTERM: the processes stop together") == 1  # rank 0's
    assert "runmodel: SIGTERM stopped the run after step 12; saved " in err
    status = runs._cache["preempted_status"]
    assert (status["status"], status["signal"], status["step"]) == ("preempted", "SIGTERM", 12)
    code, _, resumed_err, _ = runs.preempted("preempted_resumed")
    assert code == 0, resumed_err[-3000:]
    assert "ckpt-00001-0000000012.pt" in resumed_err
    runs.straight()
    straight = torch.load(runs.straight_dir / "final.pt", weights_only=True)
    resumed = torch.load(folder / "final.pt", weights_only=True)
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    status = json.loads((folder / "run" / "status.json").read_text())
    assert status["status"] == "finished"


def test_a_preempted_2_process_run_resumed_in_1_trains_on_each_sample_of_its_epoch_once(
    runs: Runs,
) -> None:
    """Stopped after 4 of epoch 1's 8 steps (2 processes, 4 samples each a step: 32 of
    the 64 samples drawn), resumed in 1 process: the 32 samples the 2 had not drawn are
    dealt out over the 1 (8 steps of 4), so over epoch 1 every sample index is trained on
    exactly once; epoch 2 is the 1-process run's own (16 steps)."""
    code, _, err, _ = runs.preempted("in_one_process")
    assert code == 0, err[-3000:]
    assert "what the 2 processes had not drawn of epoch 2 is dealt out over 1" in err, err[-3000:]

    def epochs(path: Path) -> list[tuple[int, list[int]]]:
        rows = [line.split(" ", 1) for line in path.read_text().splitlines()]
        return [(int(epoch), json.loads(batch)) for epoch, batch in rows]

    before = [
        batch
        for rank in (0, 1)
        for epoch, batch in epochs(runs.preempted_dir / f"indices-{rank}")
        if epoch == 1
    ]
    after = epochs(runs.one_dir / "indices-0")
    assert len(before) == 2 * 4 and [e for e, _ in after].count(1) == 8
    assert [e for e, _ in after].count(2) == 16
    trained = sorted(i for batch in before for i in batch) + sorted(
        i for epoch, batch in after if epoch == 1 for i in batch
    )
    assert sorted(trained) == list(range(64))


def test_a_distributed_sampler_of_the_scripts_own_cannot_go_on_mid_epoch_in_another_world(
    runs: Runs,
) -> None:
    """Its order is its own: the rest of the 2 processes' epoch cannot be dealt out anew.
    Refused at setup, naming why and what would do, before any step."""
    code, _, err, _ = runs.preempted("own_sampler")
    assert code != 0
    assert (
        "written by 2 process(es) in the middle of epoch 2 (after 4 of its batches), "
        "and this run has 1"
    ) in err, err[-3000:]
    assert "dealt out by the script's own DistributedSampler (in a DataLoader)" in err
    assert "Resume in 2 process(es), or from a checkpoint taken at an epoch's end" in err
    assert not (runs.own_sampler_dir / "setup-0").exists()  # no setup hook ran
    assert not any((runs.own_sampler_dir / "ckpt").glob("ckpt-*"))


def test_a_rank_killed_under_max_restarts_is_restarted_and_the_run_finishes_exactly(
    runs: Runs,
) -> None:
    """torchrun --max-restarts 1; rank 1 SIGKILLed at step 12 of the first attempt: torchrun
    starts both again, they continue from the step-10 checkpoint by themselves
    (resume="auto"), the launch exits 0, the run folder's status says finished, with one
    restart after rank 1's death, and the weights are the straight run's, bit for bit.
    Rank 0's failure (its lost peer) is held back until torchrun's SIGTERM reaches it: the
    signal, not the backend's exception hook, records it (a race CI lost once)."""
    code, _, err, _ = runs.restarted()
    assert code == 0, err[-4000:]
    assert "resuming from" in err and "ckpt-00001-0000000010.pt" in err, err[-3000:]
    status = json.loads((runs.restarted_dir / "run" / "status.json").read_text())
    assert status["status"] == "finished", status
    assert status["restarts"] == 1
    after = status["restarted_after"]
    assert [(r["attempt"], r["rank"]) for r in after] == [(0, 1)], after
    assert status["resumed_from"].endswith("ckpt-00001-0000000010.pt")
    runs.straight()
    straight = torch.load(runs.straight_dir / "final.pt", weights_only=True)
    restarted = torch.load(runs.restarted_dir / "final.pt", weights_only=True)
    for name in straight:
        assert torch.equal(straight[name], restarted[name]), name


# -- bad input, found before anything runs (in this process: no torchrun needed) -----------


def test_the_ddp_backend_outside_torchrun_says_how_to_start_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    model = net_module_from_text(MODEL).Net("cpu")
    with pytest.raises(
        RuntimeError,
        match=r"runs in processes started by torchrun.*"
        r"runmodel run SOURCE --nproc-per-node N",
    ):
        runmodel.Engine().run(model, epochs=1, backend="ddp")
    with pytest.raises(ValueError, match=r"process_group='tcp'"):
        DDP(process_group="tcp")
    with pytest.raises(ValueError, match=r"timeout=0"):
        DDP(timeout=0)


def net_module_from_text(text: str) -> ModuleType:
    module = ModuleType("ddp_test_net_text")
    exec(compile(text, "net.py", "exec"), module.__dict__)
    return module


def test_the_launcher_passes_torchruns_options_and_never_relaunches_under_torchrun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runmodel.cli import launch
    from runmodel.cli.parser import parser

    def parsed(*args: str) -> Any:
        return parser().parse_args(["run", "model.py", *args])

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert not launch.asked_for(parsed("--epochs", "2"))
    one_machine = parsed("--nproc-per-node", "2")
    assert launch.asked_for(one_machine)
    assert launch.torchrun_arguments(one_machine) == ["--nproc-per-node", "2", "--standalone"]
    several = parsed(
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "node0:29400",
        "--rdzv-id",
        "job42",
    )
    assert launch.torchrun_arguments(several) == [
        "--nproc-per-node",
        "4",
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "node0:29400",
        "--rdzv-id",
        "job42",
    ]
    master = parsed(
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"
    )
    assert "--standalone" not in launch.torchrun_arguments(master)
    from torch.distributed.run import get_args_parser

    options = get_args_parser().parse_args(
        [*launch.torchrun_arguments(several), "-m", "runmodel", "run", "model.py"]
    )
    assert (
        options.nnodes,
        options.nproc_per_node,
        options.rdzv_endpoint,
        options.module,
        options.training_script,
    ) == ("2", "4", "node0:29400", True, "runmodel")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job42")  # a process torchrun started
    assert not launch.asked_for(one_machine)
