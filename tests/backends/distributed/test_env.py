"""Where this process stands among a distributed run's (``runmodel/backends/distributed/
env.py``), in this process: what torchrun's environment says, and the process group that
runmodel makes and ends, made here with a world of one (gloo). The processes torchrun
starts are in test_ddp.py, test_fsdp.py and test_run_end.py."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

import runmodel
from runmodel.backends.distributed import env

TORCHRUN = (
    "TORCHELASTIC_RUN_ID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A process that no launcher started."""
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def one_process(outside: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """torchrun's environment for a world of one; no group is left behind."""
    for name, value in (
        ("TORCHELASTIC_RUN_ID", "test"),
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(free_port())),
    ):
        outside.setenv(name, value)
    try:
        yield outside
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_outside_a_launch_this_process_is_rank_0_of_1(outside: pytest.MonkeyPatch) -> None:
    assert (env.launched(), env.several(), env.rank(), env.world_size(), env.local_rank()) == (
        False,
        False,
        0,
        1,
        0,
    )
    assert env.missing_variables() == list(env.TORCHRUN_VARIABLES)
    assert env.broadcast_from_0({"a": 1}) == {"a": 1}  # a world of one: no collective
    runmodel.end_distributed()  # nothing made: nothing to end


def test_torchruns_environment_says_launched_several_rank_and_world(
    outside: pytest.MonkeyPatch,
) -> None:
    for name, value in (
        ("TORCHELASTIC_RUN_ID", "job"),
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
    ):
        outside.setenv(name, value)
    assert (env.launched(), env.several(), env.rank(), env.local_rank()) == (True, True, 3, 1)
    assert env.launch_world() == {"world_size": 4, "nproc_per_node": 2, "nnodes": 2}
    assert env.world_size() == 1  # no process group yet: the run under way is this process
    assert env.missing_variables() == ["MASTER_ADDR", "MASTER_PORT"]
    outside.setenv("WORLD_SIZE", "1")
    assert (env.launched(), env.several()) == (True, False)  # torchrun's, one of one


def test_a_group_runmodel_made_lives_until_end_distributed(one_process: pytest.MonkeyPatch) -> None:
    env.make_group("gloo", timeout=60)
    assert env.has_group() and dist.get_world_size() == 1
    assert env.broadcast_from_0("token") == "token"
    runmodel.end_distributed()
    assert not env.has_group()
    runmodel.end_distributed()  # once ended: nothing to do


def test_a_group_the_script_made_is_the_scripts_to_end(
    one_process: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    runmodel.end_distributed()
    assert env.has_group()  # left alone


def test_the_command_line_asks_without_importing_torch() -> None:
    code = (
        "import sys; from runmodel.backends.distributed import env; "
        "print(env.launched(), env.several(), 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "",
            "PYTHONPATH": ":".join(sys.path),
            "TORCHELASTIC_RUN_ID": "job",
            "WORLD_SIZE": "2",
        },
    )
    assert result.stdout.split() == ["True", "True", "False"], result.stderr


# -- restarts -------------------------------------------------------------------------------


def test_a_restarted_groups_status_names_the_rank_each_restart_followed(
    outside: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """torchrun keeps each attempt's error files side by side (``attempt_N/LOCAL_RANK/
    error.json``); the processes write theirs with ``record_failure``. Attempt 0: rank 1
    killed (no record), rank 0 recorded losing it; attempt 1: both recorded, rank 0 first;
    attempt 2 ran on two machines (the records say a world of 2, one process here):
    unknown. Then the third restart's process reads them."""
    from runmodel.backends.distributed.failures import record_failure, restarts

    def attempt(number: int, world: int, local: int, failed: dict[int, str]) -> None:
        for rank in range(local):
            folder = tmp_path / f"attempt_{number}" / str(rank)
            folder.mkdir(parents=True)
            if rank in failed:
                outside.setenv("TORCHELASTIC_ERROR_FILE", str(folder / "error.json"))
                outside.setenv("RANK", str(rank))
                outside.setenv("WORLD_SIZE", str(world))
                record_failure(RuntimeError(failed[rank]))

    attempt(0, 2, 2, {0: "Connection closed by peer"})
    attempt(1, 2, 2, {0: "rank 0 fails", 1: "rank 1 follows"})
    attempt(2, 2, 1, {0: "Connection closed by peer"})
    outside.setenv("TORCHELASTIC_RUN_ID", "job")
    assert restarts() == {}  # the first attempt: nothing restarted
    outside.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    outside.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "attempt_3" / "0" / "error.json"))
    outside.setenv("WORLD_SIZE", "2")
    outside.setenv("LOCAL_WORLD_SIZE", "2")
    recorded = restarts()
    assert recorded["restarts"] == 3
    assert [(r["attempt"], r["rank"]) for r in recorded["restarted_after"]] == [
        (0, 1),
        (1, 0),
        (2, "unknown"),
    ]
    assert "killed" in recorded["restarted_after"][0]["why"]
    assert recorded["restarted_after"][1]["why"] == "RuntimeError: rank 0 fails"
