"""A sweep refused before any trial: one error, exit 2, nothing created (no sweep folder,
no journal entry, no database study)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from sweeping import write_config

from runmodel.cli import main
from runmodel.sweeps import read_spec
from runmodel.sweeps.study import SweepStudy


def refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    *given: str,
    sweep: str = '[sweep]\nmetric = "eval_accuracy"\n',
) -> str:
    """The error of ``runmodel sweep CONFIG GIVEN...``, checked to be one line, exit 2."""
    config = write_config(tmp_path, sweep)
    code = main(["sweep", str(config), "--runs-dir", str(tmp_path / "runs"), *given])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("error") == 1 and "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (
            ["--param", "model.args.hiden={int = [16, 64]}"],
            "no option 'hiden' (did you mean 'hidden'?)",
        ),
        (["--param", "optimizer.args.lrr={uniform = [0.1, 0.2]}"], "(did you mean 'lr'?)"),
        (["--param", "epoch={int = [1, 3]}"], "unknown key 'epoch' (did you mean 'epochs'?)"),
        # [sweep.params] names that name nothing in the config
        (["--param", "model.hiden={int = [16, 64]}"], "did you mean 'model.args.hidden'?"),
        (["--param", "backend.args.devices={int = [1, 2]}"], "the config has no backend"),
        (["--param", "packs.0.args.keep={int = [1, 2]}"], "the config lists 0 pack(s)"),
        (["--param", "epochs={int = [3, 3]}"], "is empty: LOW must be below HIGH"),
        (["--param", "optimizer.args.lr={uniform = [0.1, 0.01]}"], "is inverted"),
        (["--param", "model.args.hidden={choice = []}"], "choice needs a non-empty list"),
        (["--param", "epochs={int = [1, 3]}", "--trials", "0"], "trials is a whole number >= 1"),
        (["--param", "epochs=[1, 3]"], "a space is {uniform = [LOW, HIGH]}"),
        ([], "a sweep needs parameters to search"),
        (
            ["--param", "epochs={int = [1, 3]}", "--metric", "eval_acuracy"],
            "metric 'eval_acuracy': a run of the sweep's config does not record it (did you mean "
            "'eval_accuracy'?)",
        ),
        # what a config run records, exactly: the step's loss is read by packs, not recorded
        (
            ["--param", "epochs={int = [1, 3]}", "--metric", "f1"],
            "it records: eval_accuracy, eval_loss.",
        ),
        (
            ["--param", "epochs={int = [1, 3]}", "--metric", "loss", "--direction", "min"],
            "metric 'loss': a run of the sweep's config does not record it",
        ),
        (
            ["--param", "epochs={int = [1, 3]}", "--metric", "test_accuracy"],
            "does not tune on a test split's metric",
        ),
    ],
)
def test_bad_input_exits_2_before_any_trial_creating_nothing(
    tmp_path: Path, given: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(tmp_path, capsys, *given)
    assert expected in err, err
    assert not (tmp_path / "runs").exists()


def test_a_heartbeat_is_a_whole_number_of_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(
        tmp_path,
        capsys,
        "--param",
        "epochs={int = [1, 3]}",
        sweep=('[sweep]\nmetric = "eval_accuracy"\nheartbeat = 0.5\n'),
    )
    assert "heartbeat is a whole number >= 1" in err
    assert not (tmp_path / "runs").exists()


def _without(module: str) -> str:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here: its absence cannot be shown")
    return module


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("foo://host/db", "not a database URL Optuna can use"),
        ("study.db", "not a database URL Optuna can use"),
        ("postgresql+nosuchdriver://u@127.0.0.1/db", "Can't load plugin"),
        ("sqlite:///{tmp}/no/such/folder/study.db", "cannot connect"),
        # a missing driver: the one to install; an unreachable server: what to check
        ("mssql+pymssql://u@127.0.0.1/db", "pip install pymssql"),
        ("postgresql://u:secret@127.0.0.1:9/db", "psycopg2"),
    ],
)
def test_a_bad_storage_is_one_line_naming_it_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, expected: str
) -> None:
    if "pymssql" in url:
        _without("pymssql")
    if url.startswith("postgresql://"):  # with its driver here: the server is not there
        from sqlalchemy.engine import make_url

        driver = make_url(url).get_dialect().driver  # SQLAlchemy's default: psycopg(2)
        installed = importlib.util.find_spec(driver) is not None
        expected = "cannot connect" if installed else f"its driver {driver!r} is not installed"
    url = url.format(tmp=tmp_path)
    err = refused(tmp_path, capsys, "--param", "epochs={int = [1, 3]}", "--storage", url)
    assert expected in err and "secret" not in err, err
    assert "--storage " + url.replace(":secret", ":***") in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "no").exists()


def test_a_sweep_refused_for_another_definition_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, '[sweep]\nmetric = "eval_accuracy"\n')
    folder = tmp_path / "runs" / "search"
    folder.mkdir(parents=True)
    SweepStudy.open(read_spec(config, params={"epochs": {"int": [1, 3]}}), folder, create=True)
    journal = (folder / "study.journal").read_bytes()
    code = main(
        [
            "sweep",
            str(config),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--param",
            "epochs={int = [1, 5]}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "was started with other params" in err, err
    assert (folder / "study.journal").read_bytes() == journal
    assert sorted(p.name for p in folder.iterdir()) == ["study.journal"]
