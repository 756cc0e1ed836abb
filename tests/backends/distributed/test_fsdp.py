"""The fsdp backend in real processes: torchrun starts 2 on the CPU (gloo).

Launching costs seconds, so the launches are made once per module and shared; one
launch trains, one after another in its 2 processes, a straight 4-epoch run (async
sharded checkpoints each epoch, best-K, an uneven eval set, clipping; then, in the same
script, an eval run of the trained model and its full weights gathered), the same run
stopped after 2 epochs (its final save made at the stop, collective), a run resumed from
a one-process checkpoint file, and a run accumulating gradients. Then the stopped run is
resumed in 2 processes and preempted by SIGTERM to torchrun in the middle of epoch 3
(every process saving its shards at one step), then resumed again. Under
the soak marker, a run whose rank 1 is SIGKILLed (through ``runmodel run --nproc-per-node
2 --backend fsdp``; the ddp tests kill a rank in the suite). References are computed in
this process, one process with the batches the two processes together drew.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pickle
import shutil
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
from runmodel.backends import FSDP
from runmodel.backends.distributed.fsdp import PaddedEval, rebuild_optimizer, shard_units
from runmodel.checkpoint import checkpoints_in
from runmodel.checkpoint.sharded import UnsafeCheckpointError, read_whole
from runmodel.checkpoint.sharded.safe_reader import _SafeBytes

import warm as subprocess
from helpers import with_child_net
from launching import sections, wait_for

EPOCHS, BATCH = 4, 4  # per process: 64 samples / 2 processes / 4 = 8 steps an epoch
LIMIT_S = 240

MODEL = with_child_net(
    textwrap.dedent('''
    """A small classifier under fsdp, and the hooks the tests look at."""
    import os
    import signal
    import sys
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import runmodel
    from runmodel.packs import Checkpoint, Evaluate, GradAccumulation, GradClip

    N, EVAL_N, FEATURES, CLASSES = 64, 17, 8, 3  # 17 = 9 + 8: 2 eval batches and 1


    CHILD_NET


    def full_weights(engine, path):
        """Every process takes part (an all-gather); rank 0 writes them."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_model_state_dict)

        weights = get_model_state_dict(engine.model.module, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        if engine.state.rank == 0:
            torch.save(weights, path)


    def configure(engine, out=".", what=None):
        out = os.path.abspath(out)  # here, not in the run folder `runmodel run` gives it
        os.makedirs(out, exist_ok=True)
        what = what or os.environ.get("FSDP_TEST", "")
        if what == "killed":
            @engine.on("step_start", rank=1, once=12)
            def die(engine):  # as the OOM killer or a lost machine would end it
                with open(f"{out}/killed-at", "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)

            engine.attach(Checkpoint(f"{out}/ckpt", every="5st", keep=None))
            return
        if what == "restarted":  # the straight run's training, rank 1 killed in attempt 0
            if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
                @engine.on("step_start", rank=1, once=12)
                def die_once(engine):
                    os.kill(os.getpid(), signal.SIGKILL)

            engine.attach(Checkpoint(f"{out}/ckpt", every="5st", keep=None))
        if what == "from_plain":  # resumed from a one-process checkpoint file
            first = [True]

            @engine.on("epoch_start")
            def restored(engine):
                if not first:  # the first epoch's start only
                    return
                first.clear()
                from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                                     get_optimizer_state_dict)

                full_weights(engine, f"{out}/restored.pt")
                state = get_optimizer_state_dict(engine.model.module, engine.model.optimizer,
                                                 options=StateDictOptions(full_state_dict=True,
                                                                          cpu_offload=True))
                if engine.state.rank == 0:
                    torch.save(state, f"{out}/restored-optimizer.pt")
            return
        if what == "accumulate":
            engine.attach(GradAccumulation(3), GradClip(max_norm=0.5))

            @engine.on("setup", rank=0)
            def sampler_seed(engine):
                with open(f"{out}/seed", "w") as f:
                    f.write(str(engine.model.train_data.sampler.seed))
        else:
            engine.attach(Evaluate(), GradClip(max_norm=1.0))
        if what == "straight":
            engine.attach(Checkpoint(f"{out}/ckpt", every="1ep", keep=2, async_save=True,
                                     best=("eval_loss", "min")))

            @engine.on("epoch_end", priority=-5000)
            def at_epoch_2(engine):
                if engine.state.epoch == 1:
                    full_weights(engine, f"{out}/epoch2.pt")
        if what == "stopped":  # saved only by the stop, at the end of epoch 2 (index 1)
            engine.attach(Checkpoint(f"{out}/ckpt", every="10ep"))

            @engine.on("epoch_end", priority=-5000)
            def stop_after_2(engine):
                if engine.state.epoch == 1 and not os.environ.get("RESUMED"):
                    engine.stop("after 2 epochs")

            if os.environ.get("PREEMPT_AT_STEP"):
                @engine.on("step_start", rank=0, once=int(os.environ["PREEMPT_AT_STEP"]))
                def preempted_here(engine):  # wait here until this process got the signal
                    from runmodel.backends.distributed.stopping import REQUEST

                    with open(f"{out}/ready", "w") as f:
                        f.write(str(engine.state.step))
                    while not REQUEST.signal:
                        time.sleep(0.02)

            @engine.on("teardown")
            def stopped(engine):
                with open(f"{out}/stopped-{engine.state.rank}", "w") as f:
                    f.write(f"{engine.state.step} {engine.state.stopping}")

        @engine.on("teardown")
        def final_weights(engine):
            if engine.state.error is None:
                full_weights(engine, f"{out}/final.pt")


    def evaluate_and_gather(model, out="."):
        """After the run, in the same script, as a user would: an eval run of the trained
        (sharded) module, then its full weights gathered; rank 0 writes both."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_model_state_dict)

        module, parameters = model.module, [id(p) for p in model.module.parameters()]
        evaluated = runmodel.Engine().run(model, mode="eval", backend="fsdp")
        weights = get_model_state_dict(model.module, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        as_it_was = model.module is module and parameters == [
            id(p) for p in model.module.parameters()]  # not sharded again
        if os.environ["RANK"] == "0":
            torch.save(weights, f"{out}/after.pt")
            with open(f"{out}/after.json", "w") as f:
                json.dump({"metrics": evaluated.metrics, "module_as_it_was": as_it_was}, f)


    def train(what, epochs, resume=None, out="."):
        """One training of the kind ``what`` names (see configure); rank 0 prints its
        result, a JSON line."""
        engine = runmodel.Engine()
        configure(engine, out, what)
        torch.manual_seed(12345)  # a resumed run: the checkpoint sets the generators
        model = Net()
        from runmodel.backends import FSDP

        result = engine.run(model, epochs=epochs, resume=resume,
                            backend=FSDP(preempt_check_every=3), preempt_signals=("SIGTERM",))
        if os.environ["RANK"] == "0":
            print(json.dumps({"ended": result.ended, "steps": result.steps,
                              "metrics": result.metrics}), flush=True)
        if what == "straight":
            evaluate_and_gather(model, out)


    if __name__ == "__main__":
        if sys.argv[1] == "--each":  # net.py --each RUNS.json: train's arguments, in turn
            with open(sys.argv[2]) as f:
                for run in json.load(f):
                    for stream in (sys.stdout, sys.stderr):  # where each one's output begins
                        if os.environ["RANK"] == "0":
                            print(f"=== run {run['what']} ===", file=stream, flush=True)
                    train(**run)
        else:  # net.py EPOCHS [RESUME]: the training FSDP_TEST names
            train(os.environ.get("FSDP_TEST", ""), int(sys.argv[1]),
                  sys.argv[2] if len(sys.argv) > 2 else None)
''')
).replace("import os\n", "import json\nimport os\n", 1)


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


def torchrun(
    root: Path, cwd: Path, *args: str, options: tuple[str, ...] = (), **env: str
) -> subprocess.Popen[str]:
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return launch(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            *options,
            str(root / "net.py"),
            *args,
        ],
        cwd,
        PYTHONPATH=path,
        **env,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the launch did not end within {LIMIT_S}s:\n{err[-3000:]}")
    return process.returncode, out, err


class Runs:
    """The launches, made once: the first trains several runs in turn; awaited when a
    test needs one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "net.py").write_text(MODEL)
        self.dirs = {
            name: root / name
            for name in (
                "straight",
                "stopped",
                "killed",
                "accumulate",
                "from_plain",
                "restarted",
                "in_one",
            )
        }
        for folder in self.dirs.values():
            folder.mkdir()
        self._cache: dict[str, Any] = {}
        self._processes: list[subprocess.Popen[str]] = []
        self._threads: dict[str, threading.Thread] = {}
        # a one-process run's checkpoint file, resumed under fsdp
        model = net_module(root).Net("cpu")
        engine = runmodel.Engine()
        from runmodel.packs import Checkpoint

        engine.attach(Checkpoint(self.dirs["from_plain"] / "plain"))
        engine.run(model, epochs=1)
        self.plain_checkpoint = self.dirs["from_plain"] / "plain" / "ckpt-00001-0000000016.pt"
        # the trainings of one launch, then the stopped one resumed: in a thread
        self._stopped = threading.Thread(target=self._stop_and_resume, daemon=True)
        self._stopped.start()

    def start_killed(self) -> None:
        """The run whose rank 1 is SIGKILLed (soak only): started when a test asks."""
        if "killed" not in self._threads:
            self._start(
                "killed",
                launch(
                    [
                        sys.executable,
                        "-m",
                        "runmodel",
                        "run",
                        str(self.root / "net.py"),
                        "--nproc-per-node",
                        "2",
                        "--backend",
                        "fsdp",
                        "--epochs",
                        "3",
                        "--no-progress",
                    ],
                    self.dirs["killed"],
                    FSDP_TEST="killed",
                ),
            )

    def start_soak(self) -> None:
        """The fsdp twins of ddp checks (soak only), started when a test asks: a run whose
        rank 1 is killed under --max-restarts 1, and the preempted run's mid-epoch
        checkpoint resumed in 1 process."""
        if "restarted" not in self._threads:
            self._start(
                "restarted",
                torchrun(
                    self.root,
                    self.dirs["restarted"],
                    str(EPOCHS),
                    "auto",
                    options=("--max-restarts", "1"),
                    FSDP_TEST="restarted",
                ),
            )
            self.result("preempted")
            path = os.pathsep.join(filter(None, [str(self.root), os.environ.get("PYTHONPATH")]))
            self._start(
                "in_one",
                launch(
                    [
                        sys.executable,
                        "-m",
                        "torch.distributed.run",
                        "--standalone",
                        "--nproc-per-node",
                        "1",
                        str(self.root / "net.py"),
                        str(EPOCHS),
                        str(self.dirs["stopped"] / "ckpt" / "ckpt-00002-0000000021"),
                    ],
                    self.dirs["in_one"],
                    PYTHONPATH=path,
                    FSDP_TEST="in_one",
                ),
            )

    def _start(self, name: str, process: subprocess.Popen[str]) -> None:
        """Await ``process`` in a thread of its own: its output drained, the time it
        ended noted."""
        self._processes.append(process)

        def await_it() -> None:
            self._cache[name] = finish(process)
            self._cache[f"{name}_ended"] = time.time()

        self._threads[name] = threading.Thread(target=await_it, daemon=True)
        self._threads[name].start()

    def _stop_and_resume(self) -> None:
        """One launch trains in turn the straight run, the run stopped after 2 epochs, the
        accumulating one and the one resumed from the one-process file (each training's
        result: the launch's exit code and its part of the output); then the stopped run
        is resumed and preempted, and resumed again, in launches of their own."""
        folder = self.dirs["stopped"]
        each = [
            {"what": "straight", "epochs": EPOCHS},
            {"what": "stopped", "epochs": EPOCHS},
            {"what": "accumulate", "epochs": 2},
            {"what": "from_plain", "epochs": 2, "resume": str(self.plain_checkpoint)},
        ]
        for run in each:
            run["out"] = str(self.dirs[str(run["what"])])
        (self.root / "each.json").write_text(json.dumps(each))
        first = torchrun(self.root, self.root, "--each", str(self.root / "each.json"))
        self._processes.append(first)
        code, out, err = finish(first)
        outs, errs = sections(out), sections(err)
        for run in each:
            name = str(run["what"])
            self._cache[name] = (code, outs.get(name, out), errs.get(name, err))
        self._cache["stopped_checkpoints"] = sorted(p.name for p in (folder / "ckpt").iterdir())
        if (folder / "final.pt").exists():
            shutil.move(folder / "final.pt", folder / "at-stop.pt")
        # resumed, then preempted by SIGTERM to torchrun once rank 0 is at step 18 (it
        # waits there for the signal): the processes check every 3 steps, so the first
        # check after it is the one after step 20: both stop after step 21, mid-epoch 3
        second = torchrun(
            self.root,
            folder,
            str(EPOCHS),
            str(folder / "ckpt"),
            options=("--shutdown-timeout", str(LIMIT_S)),
            FSDP_TEST="stopped",
            RESUMED="1",
            PREEMPT_AT_STEP="18",
        )
        self._processes.append(second)
        wait_for(folder / "ready", second, LIMIT_S)
        second.send_signal(signal.SIGTERM)
        self._cache["preempted"] = finish(second)
        self._cache["preempted_stopped"] = [  # before the resume writes them again
            (folder / f"stopped-{rank}").read_text()
            if (folder / f"stopped-{rank}").exists()
            else None
            for rank in (0, 1)
        ]
        third = torchrun(
            self.root, folder, str(EPOCHS), str(folder / "ckpt"), FSDP_TEST="stopped", RESUMED="2"
        )
        self._processes.append(third)
        self._cache["resumed"] = finish(third)

    def result(self, name: str) -> tuple[int, str, str]:
        if name not in self._threads:
            self._stopped.join(timeout=4 * LIMIT_S)
        else:
            self._threads[name].join(timeout=2 * LIMIT_S)
        assert name in self._cache, f"the {name} launch did not end"
        result: tuple[int, str, str] = self._cache[name]
        return result

    def ok(self, name: str) -> tuple[int, str, str]:
        code, out, err = self.result(name)
        assert code == 0, err[-4000:]
        return code, out, err

    def close(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)  # its thread reads what is left
        for thread in (*self._threads.values(), self._stopped):
            thread.join(timeout=LIMIT_S)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    made = Runs(tmp_path_factory.mktemp("fsdp"))
    try:
        yield made
    finally:
        made.close()


def net_module(root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("fsdp_test_net", root / "net.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weights(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def assert_equal_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# -- resume and export ------------------------------------------------------------------------


def test_a_run_stopped_then_preempted_and_resumed_each_time_ends_bit_identical(runs: Runs) -> None:
    """The stop's save is collective (every process writes its shard, after the end
    agreement); so is the save at a preemption: SIGTERM to torchrun in the middle of
    epoch 3 stops both processes after the same step (their check every 3 steps), and
    each writes its shards and its run state of that step. Each resumed run, in 2
    processes again, reads each process's shards, RNG, sampler seed and position, and the
    last ends where the straight run did, bit for bit."""
    runs.ok("straight")
    code, out, err = runs.result("stopped")
    assert code == 0, err[-4000:]
    assert json.loads(out)["ended"] == "stopped"
    assert runs._cache["stopped_checkpoints"] == ["ckpt-00002-0000000016"]
    folder = runs.dirs["stopped"] / "ckpt" / "ckpt-00002-0000000016"
    assert sorted(p.name for p in folder.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "run-0.pt",
        "run-1.pt",
    ]
    _, _, err = runs.result("preempted")
    stopped = runs.dirs["stopped"]
    assert (stopped / "ready").read_text() == "18", err[-4000:]
    assert runs._cache["preempted_stopped"] == ["21 preempted"] * 2, err[-4000:]
    assert "runmodel: SIGTERM stopped the run after step 21; saved " in err
    at_signal = stopped / "ckpt" / "ckpt-00002-0000000021"  # epoch index 2, 5 of 8 steps
    assert sorted(p.name for p in at_signal.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "run-0.pt",
        "run-1.pt",
    ]
    for rank in (0, 1):
        counters = runmodel.checkpoint.read(at_signal / f"run-{rank}.pt")["engine"]["counters"]
        assert (counters["step"], counters["epoch"], counters["epoch_step"]) == (21, 2, 5)
    code, out, err = runs.result("resumed")
    assert code == 0, err[-4000:]
    assert (json.loads(out)["ended"], json.loads(out)["steps"]) == ("completed", 32)
    straight = weights(runs.dirs["straight"] / "final.pt")
    assert_equal_weights(weights(runs.dirs["stopped"] / "final.pt"), straight)
    initial = net_module(runs.root).Net("cpu").module.state_dict()
    assert not any(torch.equal(straight[k], initial[k]) for k in straight)


def test_export_of_the_epoch_2_checkpoint_is_the_full_weights_the_run_had_then(
    runs: Runs, tmp_path: Path
) -> None:
    runs.ok("straight")
    from runmodel.cli import main

    folder = runs.dirs["stopped"] / "ckpt" / "ckpt-00002-0000000016"
    runs.result("stopped")
    assert main(["export", str(folder), str(tmp_path / "epoch2.pt")]) == 0
    exported = weights(tmp_path / "epoch2.pt")
    assert_equal_weights(exported, weights(runs.dirs["straight"] / "epoch2.pt"))
    assert_equal_weights(exported, weights(runs.dirs["stopped"] / "at-stop.pt"))
    model = net_module(runs.root).Net("cpu")
    model.module.load_state_dict(exported)  # the bare module takes it as it is
    # the Checkpoint pack's folder: its newest whole checkpoint, the final weights
    assert main(["export", str(runs.dirs["straight"] / "ckpt"), str(tmp_path / "last.pt")]) == 0
    assert_equal_weights(weights(tmp_path / "last.pt"), weights(runs.dirs["straight"] / "final.pt"))


def test_async_sharded_checkpoints_keep_2_and_record_the_best(runs: Runs) -> None:
    runs.ok("straight")
    folder = runs.dirs["straight"] / "ckpt"
    best = json.loads((folder / "best.json").read_text())
    names = sorted(p.name for p in folder.iterdir())
    assert best["metric"] == "eval_loss" and len(best["best"]) == 1
    kept = {"ckpt-00003-0000000024", "ckpt-00004-0000000032", best["best"][0]["checkpoint"]}
    assert names == sorted({"best.json", *kept})  # no staging folder left, no link
    newest = checkpoints_in(folder)[0]
    assert newest.name == "ckpt-00004-0000000032"


def test_a_staging_folder_is_never_picked_to_resume(runs: Runs, tmp_path: Path) -> None:
    """A save that died before its rename leaves a hidden staging folder (and a folder
    without its metadata is not whole): neither is a checkpoint."""
    runs.ok("straight")
    source = runs.dirs["straight"] / "ckpt" / "ckpt-00004-0000000032"
    shutil.copytree(source, tmp_path / ".ckpt-00005-0000000040.tmp-abc")
    shutil.copytree(source, tmp_path / "ckpt-00006-0000000048")
    (tmp_path / "ckpt-00006-0000000048" / ".metadata").unlink()
    shutil.copytree(source, tmp_path / "ckpt-00004-0000000032")
    assert [p.name for p in checkpoints_in(tmp_path)] == ["ckpt-00004-0000000032"]


def test_a_one_process_checkpoint_file_resumes_under_fsdp(runs: Runs) -> None:
    """Every process reads the whole file and keeps its shards: the weights and the
    momentum buffers the run starts from are the file's."""
    runs.ok("from_plain")
    saved = runmodel.checkpoint.read(runs.plain_checkpoint)["model"]
    assert_equal_weights(weights(runs.dirs["from_plain"] / "restored.pt"), saved["module"])
    optimizer = torch.load(runs.dirs["from_plain"] / "restored-optimizer.pt", weights_only=True)
    names = list(saved["module"])  # the parameters, in the optimizer's order
    for number, state in saved["optimizer"]["state"].items():
        assert torch.equal(
            optimizer["state"][names[number]]["momentum_buffer"], state["momentum_buffer"]
        ), names[number]


# -- evaluation --------------------------------------------------------------------------------


def test_eval_metrics_are_those_of_the_whole_eval_set_with_uneven_shares(runs: Runs) -> None:
    """17 eval samples, batches of 8: rank 0 has 2 batches, rank 1 one batch and a padding
    forward; the metrics are the one-process values of the same weights."""
    _, out, _ = runs.ok("straight")
    metrics = json.loads(out)["metrics"]
    model = net_module(runs.root).Net("cpu")
    model.setup()
    model.module.load_state_dict(weights(runs.dirs["straight"] / "final.pt"))
    whole = runmodel.evaluate(model)
    assert metrics["eval_accuracy"] == pytest.approx(whole["accuracy"], abs=1e-9)
    assert metrics["eval_loss"] == pytest.approx(whole["loss"], rel=1e-6)


# -- the trained model in the same script ------------------------------------------------------


def test_after_the_run_the_same_script_evaluates_and_gathers_the_sharded_module(runs: Runs) -> None:
    """The process group the backend made lives on after the run: the script's eval run
    (``engine.run(model, mode="eval", backend="fsdp")``) takes the sharded module as it
    is, not sharded again, and ``get_model_state_dict(..., full_state_dict=True)``
    gathers it; every process exits 0 (torchrun's own exit code is 0 only then)."""
    _, out, _ = runs.ok("straight")
    after = json.loads((runs.dirs["straight"] / "after.json").read_text())
    assert after["module_as_it_was"]
    final = weights(runs.dirs["straight"] / "final.pt")  # gathered in the run's teardown
    assert_equal_weights(weights(runs.dirs["straight"] / "after.pt"), final)
    model = net_module(runs.root).Net("cpu")
    model.setup()
    model.module.load_state_dict(final)
    whole = runmodel.evaluate(model)
    assert after["metrics"]["accuracy"] == pytest.approx(whole["accuracy"], abs=1e-9)
    assert after["metrics"]["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    trained = json.loads(out)["metrics"]  # the last epoch's Evaluate, of the same weights
    assert after["metrics"]["loss"] == pytest.approx(trained["eval_loss"], rel=1e-6)


# -- gradient accumulation ------------------------------------------------------------------


class DealtOrder(Sampler[int]):
    """What 2 DistributedSamplers deal out, as one process's order (see test_ddp.py)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=g).tolist())

    def __len__(self) -> int:
        return self.size


def test_accumulation_and_clipping_train_as_one_process_with_twice_the_batch(runs: Runs) -> None:
    """GradAccumulation(3) (windows 3, 3, 2 of an 8-step epoch; only each window's last
    backward reduces) and GradClip on the true global norm: the 2-process fsdp run with
    batch b trains as one process with batch 2b does."""
    runs.ok("accumulate")
    from runmodel.packs import GradAccumulation, GradClip

    net = net_module(runs.root)
    sampler = DealtOrder(net.N, int((runs.dirs["accumulate"] / "seed").read_text()))

    class Reference(net.Net):  # type: ignore[misc, name-defined]
        def setup(self, setup_options: Any = None) -> None:
            super().setup({"batch_size": 2 * BATCH})
            self.train_data = DataLoader(
                self.train_data.dataset, batch_size=2 * BATCH, sampler=sampler
            )

    engine = runmodel.Engine()
    engine.attach(GradAccumulation(3), GradClip(max_norm=0.5))
    engine.on("epoch_start", lambda engine: setattr(sampler, "epoch", engine.state.epoch))
    model = Reference("cpu")
    engine.run(model, epochs=2)
    trained = weights(runs.dirs["accumulate"] / "final.pt")
    expected = model.module.state_dict()
    for name, value in trained.items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-5, msg=name)


# -- failures -------------------------------------------------------------------------------


@pytest.mark.soak  # the ddp tests kill a rank in the suite: the same launcher and backend code
def test_a_killed_rank_ends_the_run_in_seconds_naming_it(runs: Runs) -> None:
    runs.start_killed()
    code, _, err = runs.result("killed")
    ended = runs._cache["killed_ended"]
    assert code == 1, err[-3000:]
    assert "runmodel run: error: process rank 1 failed (killed by SIGKILL)" in err, err[-3000:]
    killed_at = float((runs.dirs["killed"] / "killed-at").read_text())
    assert ended - killed_at < 20, f"the run took {ended - killed_at:.1f}s to end"
    # the step-10 save is whole; nothing half-written is visible
    assert [p.name for p in checkpoints_in(runs.dirs["killed"] / "ckpt")] == [
        "ckpt-00001-0000000010",
        "ckpt-00000-0000000005",
    ]


@pytest.mark.soak  # test_ddp.py restarts a ddp run in the suite: the same agent and pack code
def test_a_rank_killed_under_max_restarts_is_restarted_and_ends_bit_identical(runs: Runs) -> None:
    runs.start_soak()
    code, _, err = runs.result("restarted")
    assert code == 0, err[-4000:]
    assert "resuming from" in err and "ckpt-00001-0000000010" in err, err[-3000:]
    runs.ok("straight")
    assert_equal_weights(
        weights(runs.dirs["restarted"] / "final.pt"), weights(runs.dirs["straight"] / "final.pt")
    )


@pytest.mark.soak  # test_ddp.py deals a preempted epoch's rest out over 1 process in the suite
def test_a_preempted_2_process_run_goes_on_in_1_with_the_rest_of_its_epoch(runs: Runs) -> None:
    """Preempted after 5 of epoch 3's 8 steps (2 processes, 4 samples each: 40 of 64
    drawn): in 1 process the 24 left make 6 steps, then epoch 4 has 16: 43 steps."""
    runs.start_soak()
    code, out, err = runs.result("in_one")
    assert code == 0, err[-4000:]
    assert "what the 2 processes had not drawn of epoch 3 is dealt out over 1" in err
    assert json.loads(out)["steps"] == 21 + 6 + 16


# -- loading never runs code (in this process) --------------------------------------------


class _Payload:
    """Unpickled, it would write a file: what a planted checkpoint would do instead."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.path}",)


def test_a_payload_planted_in_the_metadata_does_not_run(runs: Runs, tmp_path: Path) -> None:
    runs.ok("straight")
    folder = tmp_path / "ckpt-00004-0000000032"
    shutil.copytree(runs.dirs["straight"] / "ckpt" / folder.name, folder)
    marker = tmp_path / "payload-ran"
    with open(folder / ".metadata", "rb") as file:
        metadata = pickle.load(file)  # our own file, written by the test run
    metadata.planted = _Payload(str(marker))  # unpickling it calls os.system
    with open(folder / ".metadata", "wb") as file:
        pickle.dump(metadata, file)
    with pytest.raises(UnsafeCheckpointError, match=r"posix\.system|os\.system"):
        read_whole(folder, optimizer=False)
    from runmodel.cli import main

    assert main(["export", str(folder), str(tmp_path / "out.pt")]) == 2
    assert not marker.exists() and not (tmp_path / "out.pt").exists()
    # what torch's own reader would have done with the same file
    from torch.distributed.checkpoint import FileSystemReader

    FileSystemReader(folder).read_metadata()
    assert marker.exists()


def test_a_non_tensor_item_is_read_with_weights_only(tmp_path: Path) -> None:
    """The optimizer's hyperparameters are items of their own, which torch's planner
    loads with weights_only=False: the reader loads them with weights_only=True."""
    marker = tmp_path / "payload-ran"
    stream = io.BytesIO()
    torch.save({"lr": _Payload(str(marker))}, stream)
    stream.seek(0)

    class Planner:
        def load_bytes(self, item: Any, value: io.BytesIO) -> None:
            raise AssertionError("handed on")

    with pytest.raises(pickle.UnpicklingError):
        _SafeBytes(Planner()).load_bytes(None, stream)
    assert not marker.exists()


# -- in this process: options, units, the optimizer, padding --------------------------------


def test_bad_options_are_refused_saying_what_would_do(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "localhost"),
        ("MASTER_PORT", "1"),
    ):
        monkeypatch.setenv(name, value)  # as under torchrun; nothing connects
    with pytest.raises(ValueError, match=r"FSDP\(param_dtype='int8'\).*'bfloat16'"):
        FSDP(param_dtype="int8")
    with pytest.raises(TypeError, match=r"FSDP\(units=3\)"):
        FSDP(units=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"FSDP\(process_group='tcp'\)"):
        FSDP(process_group="tcp")
    with pytest.raises(ValueError, match=r"FSDP\(checkpoint_timeout=0\)"):
        FSDP(checkpoint_timeout=0)
    from runmodel.config.registry import make_backend

    made = make_backend(
        {
            "type": "fsdp",
            "args": {
                "units": ["Linear"],
                "param_dtype": "bfloat16",
                "reshard_after_forward": False,
            },
        }
    )
    assert isinstance(made, FSDP) and made.units == ["Linear"]
    assert (made.param_dtype, made.reshard_after_forward) == (torch.bfloat16, False)


def test_the_fsdp_backend_outside_torchrun_says_how_to_start_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(
        RuntimeError,
        match=r"the fsdp backend runs in processes started by "
        r"torchrun.*--nproc-per-node N",
    ):
        FSDP()


def test_shard_units_by_default_by_class_and_by_name() -> None:
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)

    module = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), Block(), Block())
    assert shard_units(module, None) == [module[0], module[2], module[3]]
    assert shard_units(module, ["Block"]) == [module[2], module[3]]
    assert shard_units(module, [Block, "0"]) == [module[2], module[3], module[0]]
    assert shard_units(module, ["2.inner", "Block"])[0] is module[2].inner  # innermost first
    with pytest.raises(ValueError, match=r"'Attention' names no submodule.*Block"):
        shard_units(module, ["Attention"])


def test_the_optimizer_is_made_again_with_its_groups_and_hyperparameters() -> None:
    from torch import nn

    old_module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    names = {id(p): n for n, p in old_module.named_parameters()}
    old = torch.optim.AdamW(
        [
            {"params": old_module[0].parameters(), "lr": 0.5},
            {"params": old_module[1].parameters(), "weight_decay": 0.0},
        ],
        lr=0.01,
        betas=(0.8, 0.9),
    )
    scheduler = torch.optim.lr_scheduler.StepLR(old, step_size=2)
    new_module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))  # as fully_shard replaces
    new = rebuild_optimizer(old, names, new_module)
    assert type(new) is torch.optim.AdamW
    assert [g["params"] for g in new.param_groups] == [
        list(new_module[0].parameters()),
        list(new_module[1].parameters()),
    ]
    for a, b in zip(old.param_groups, new.param_groups, strict=True):
        assert {k: v for k, v in a.items() if k != "params"} == {
            k: v for k, v in b.items() if k != "params"
        }
    from runmodel.backends.distributed.fsdp import follow_schedulers

    holder = type("Holder", (), {})()
    holder.scheduler = scheduler
    follow_schedulers(holder, old, new)
    assert scheduler.optimizer is new
    new.step()
    scheduler.step()
    scheduler.step()
    assert new.param_groups[0]["lr"] == pytest.approx(0.05)
    old.step()  # stepped: its state cannot follow
    old_module[0].weight.grad = torch.ones(2, 2)
    old.step()
    with pytest.raises(ValueError, match=r"has state already"):
        rebuild_optimizer(old, names, new_module)


def test_padded_eval_runs_the_missing_forwards_and_yields_only_real_batches() -> None:
    from torch import nn

    calls: list[int] = []
    model = runmodel.TorchModel.from_parts(nn.Linear(2, 1), device="cpu")
    model.module.register_forward_hook(lambda m, i, o: calls.append(len(i[0])))
    real = [(torch.ones(3, 2), torch.ones(3))]
    padded = PaddedEval(real, 1, 3, model, (torch.zeros(1, 2), torch.zeros(1)))
    assert list(padded) == real and len(padded) == 1
    assert calls == [1, 1]  # two forwards on the stand-in, after the real batch
