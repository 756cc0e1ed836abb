"""The command line answers --help and usage errors without importing torch, which is
what makes a run slow to start (torch is imported once a run needs it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    import sys
    import runmodel.cli
    try:
        code = runmodel.cli.main(sys.argv[1:])
    except SystemExit as exit:
        code = exit.code
    print("torch imported:", "torch" in sys.modules, "exit:", code)
""")


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60
    )


def test_help_does_not_import_torch() -> None:
    for args in (["--help"], ["run", "--help"], ["benchmark", "--help"], ["plot", "--help"]):
        result = probe(*args)
        assert "usage: runmodel" in result.stdout
        assert result.stdout.rstrip().endswith("torch imported: False exit: 0"), result.stdout


def test_usage_errors_do_not_import_torch() -> None:
    for args in (
        ["run"],
        ["frobnicate"],
        ["run", "x.py", "--steps", "-3"],
        ["run", "x.py", "--nproc-per-node", "0"],
        ["run", "x.py", "--nnodes", "two"],
        ["run", "missing.py", "--nproc-per-node", "2"],
        ["run", "config.toml", "--nproc-per-node", "2"],
        ["plot"],
    ):
        result = probe(*args)
        assert "error:" in result.stderr
        assert result.stdout.strip() == "torch imported: False exit: 2", (args, result)


def test_importing_runmodel_does_not_import_torch_until_a_name_needs_it() -> None:
    code = (
        "import sys, runmodel; a = 'torch' in sys.modules; runmodel.Engine;"
        " print(a, 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split() == ["False", "True"], result.stderr


def test_launcher_options_are_checked_before_torch_is_imported() -> None:
    result = probe("run", "x.py", "--nproc-per-node", "0")
    assert "--nproc-per-node: invalid check value: '0'" not in result.stderr
    assert "argument --nproc-per-node: '0': give a number of processes >= 1" in result.stderr
    result = probe("run", "missing.py", "--nproc-per-node", "2")
    assert "runmodel run: error: missing.py: no such file 'missing.py'" in result.stderr
    result = probe("run", "config.toml", "--nproc-per-node", "2")
    assert "runmodel run: error: config.toml: no such config file" in result.stderr
    help_text = probe("run", "--help").stdout
    for flag in (
        "--nproc-per-node",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--rdzv-endpoint",
        "--rdzv-id",
        "--standalone",
    ):
        assert flag in help_text
