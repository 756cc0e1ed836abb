"""Every ```python block in docs/ and README.md runs, as a reader would run it.

A page's blocks run in order in one namespace, in a fresh process whose working directory
is an empty temporary folder, so blocks that write (checkpoints, ``runs/``) write there. A
block that is not meant to run on its own is marked by the line ``<!-- fragment -->``
directly before its opening fence; it is skipped and counted, and each page's count of
run and skipped blocks must add up to the ```python fences found in it by a second,
plainer scan, so nothing is skipped silently. A failing block is reported with its page
and the line in that page (tracebacks point into the markdown file).

A block marked by ``<!-- outputs -->`` directly before its fence promises its outputs:
each line ``print(...)  # TEXT`` of it must print TEXT (its first call; ``...`` stands
for anything, as in ``0.9...``), and the test compares them.

Starting a process that imports torch takes about 3 s here; a page takes about 0.1 s of
work. So the pages' processes are forked from one process that imported torch, runmodel
and their usual companions once (a "zygote": the same idea as multiprocessing's
forkserver): each page still gets a process of its own, with nothing of another page's.

``mkdocs build --strict`` is not a test here: it is a step of the CI command (README.md,
``.ci/run``), which is where the issue puts it and where it runs once, not per pytest
invocation.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAGMENT = "<!-- fragment -->"
OUTPUTS = "<!-- outputs -->"
PROMISE = re.compile(r"^\s*print\(.*\)\s+#\s?(?P<text>.*\S)\s*$")
PAGE_TIMEOUT_S = 120
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    # what the block's prints promise (<!-- outputs -->), by the page's line of the print
    promises: dict[int, str] = field(default_factory=dict)


@dataclass
class Page:
    path: Path
    name: str  # as reported: relative to the repository
    blocks: list[Block] = field(default_factory=list)
    fragments: list[int] = field(default_factory=list)  # fence lines of skipped blocks
    errors: list[str] = field(default_factory=list)


def parse(path: Path, name: str | None = None) -> Page:
    """The page's ```python blocks, the fragments among them, and misplaced markers."""
    page = Page(path, name or path.relative_to(ROOT).as_posix())
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            marker = lines[i].strip()
            if marker in (FRAGMENT, OUTPUTS) and not _opens_python(lines, i + 1):
                page.errors.append(
                    f"{page.name}:{i + 1}: {marker} is not directly before a ```python fence"
                )
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        language = match["info"].split(" ")[0].split("{")[0].lower()
        end = i + 1
        while end < len(lines):
            close = FENCE.match(lines[end])
            if (
                close
                and close["fence"][0] == fence[0]
                and len(close["fence"]) >= len(fence)
                and not close["info"]
            ):
                break
            end += 1
        if language in ("py", "python3", "py3", "pycon"):
            page.errors.append(
                f"{page.name}:{i + 1}: tag the block ```python (not "
                f"```{language}) so that it runs or is a marked fragment"
            )
        if language == "python":
            if i > 0 and lines[i - 1].strip() == FRAGMENT:
                page.fragments.append(i + 1)
            else:
                body = [
                    line[indent:] if line[:indent].strip() == "" else line.lstrip()
                    for line in lines[i + 1 : end]
                ]
                block = Block(i + 1, "\n".join(body) + "\n")
                if i > 0 and lines[i - 1].strip() == OUTPUTS:
                    for n, line in enumerate(body):
                        if promise := PROMISE.match(line):
                            block.promises[i + 2 + n] = promise["text"]
                page.blocks.append(block)
        i = end + 1
    return page


def _opens_python(lines: list[str], i: int) -> bool:
    match = FENCE.match(lines[i]) if i < len(lines) else None
    return bool(match) and match["info"].split(" ")[0].lower() == "python"


def pages() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


# The process that forks one child per page. It reads a job per line on stdin, answers
# with the child's exit code; the child redirects its output to the job's log, runs the
# blocks with each one's code placed at its own line of the page, and is ended by
# SIGALRM after the job's timeout.
ZYGOTE = r"""
import json, os, signal, sys, traceback, warnings
# the pages' models are tiny: one thread is faster than two, and leaves a core to pytest
os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.simplefilter("ignore", DeprecationWarning)  # only while importing, below
import torch, runmodel, runmodel.engine, runmodel.packs, runmodel.models, runmodel.modes
torch.set_num_threads(1)
# (torch._dynamo: constructing a torch.optim optimizer imports it, 1.5 CPU-s a page)
for name in ("ignite.engine", "ignite.metrics", "ignite.handlers", "sklearn.datasets",
             "torch.utils.tensorboard", "torch.utils.data", "tqdm", "torch._dynamo"):
    try:
        __import__(name)
    except ImportError:
        pass
warnings.resetwarnings()

def child(job):
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(job["timeout"])
    os.chdir(job["cwd"])
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull)
    os.environ["MPLBACKEND"] = "Agg"
    namespace = {"__name__": "__main__"}
    promised, printed = set(job["promised"]), {}
    if promised:
        import builtins, io
        def checked_print(*args, **kwargs):
            at = sys._getframe(1).f_lineno
            if at in promised and at not in printed and kwargs.get("file") is None:
                text = io.StringIO()
                builtins.print(*args, **{**kwargs, "file": text})
                printed[at] = text.getvalue()
            builtins.print(*args, **kwargs)
        namespace["print"] = checked_print
    for path, name, line, code in job["blocks"]:
        print(f"# ---- {name}:{line}", flush=True)
        try:
            exec(compile("\n" * line + code, path, "exec"), namespace)
        except BaseException as error:
            if isinstance(error, SystemExit) and error.code in (None, 0):
                continue
            traceback.print_exc()
            print(f"DOCS: the block at {name}:{line} failed", flush=True)
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(1)
    with open(job["printed"], "w") as out:
        json.dump(printed, out)
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)

print("ready", flush=True)
for text in sys.stdin:
    job = json.loads(text)
    pid = os.fork()
    if pid == 0:
        try:
            child(job)
        finally:
            os._exit(70)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class Zygote:
    def __init__(self) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._read(120) == "ready", "the docs test's zygote did not start"

    def _read(self, timeout: float) -> str:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError("no answer from the docs test's zygote")
        return self.process.stdout.readline().strip()

    def run(self, page: Page, cwd: Path, log: Path, printed: Path | None = None) -> int:
        assert self.process.stdin is not None
        job = {
            "cwd": str(cwd),
            "log": str(log),
            "promised": [n for b in page.blocks for n in b.promises],
            "printed": str(printed or log.with_suffix(".printed.json")),
            "timeout": PAGE_TIMEOUT_S,
            "blocks": [(str(page.path), page.name, b.line, b.code) for b in page.blocks],
        }
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        return int(json.loads(self._read(PAGE_TIMEOUT_S + 30))["rc"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    process = Zygote()
    yield process
    process.close()


@pytest.mark.parametrize("path", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_blocks_run(
    path: Path, zygote: Zygote, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    page = parse(path)
    assert not page.errors, "\n".join(page.errors)
    fences = sum(
        1
        for line in path.read_text().splitlines()
        if re.fullmatch(r"\s*(```+|~~~+)\s*python\b.*", line)
    )
    assert len(page.blocks) + len(page.fragments) == fences, (
        f"{page.name}: {fences} ```python fences, but {len(page.blocks)} blocks to run and "
        f"{len(page.fragments)} fragments were found"
    )
    record_property("blocks_run", len(page.blocks))
    record_property("fragments_skipped", len(page.fragments))
    if not page.blocks:
        return
    work = tmp_path / "cwd"
    work.mkdir()
    log = tmp_path / "output.log"
    rc = zygote.run(page, work, log)
    output = log.read_text() if log.exists() else ""
    if rc != 0:
        why = "timed out" if rc == -14 else f"exit code {rc}"
        failed = re.findall(r"DOCS: the block at (\S+) failed", output)
        where = failed[-1] if failed else "(no block named: the process died)"
        pytest.fail(
            f"{page.name}: block at {where} failed ({why}):\n{output[-6000:]}", pytrace=False
        )
    printed = json.loads(log.with_suffix(".printed.json").read_text())
    broken = [
        f"{page.name}:{line}: promises {text!r}, printed {printed.get(str(line))!r}"
        for block in page.blocks
        for line, text in block.promises.items()
        if not kept(text, printed.get(str(line)))
    ]
    assert not broken, "\n".join(broken)


def kept(promise: str, printed: str | None) -> bool:
    """Whether ``printed`` (a print's output) is what ``promise`` says, ``...`` standing
    for anything."""
    if printed is None:
        return False
    pattern = ".*?".join(re.escape(part) for part in promise.split("..."))
    return re.fullmatch(pattern, printed.strip(), re.DOTALL) is not None


def test_the_parser_finds_blocks_fragments_and_stray_markers(tmp_path: Path) -> None:
    """The scanner above, on a page with every case: it is what decides what runs."""
    text = (
        "\n".join(
            [
                "# t",
                "```python",
                "x = 1",
                "```",  # 2: runs
                FRAGMENT,
                "```python",
                "undefined_name",
                "```",  # 6: fragment
                "* item",
                "",
                "  ```python",
                "  y = x + 1",
                "  ```",  # 11: indented, runs
                FRAGMENT,
                "",
                "```python",
                "z = 3",
                "```",  # 14: stray marker
                "````markdown",
                "```python",
                "not a block",
                "```",
                "````",  # 19: inside another
                "```py",
                "w = 4",
                "```",  # 24: wrong tag
            ]
        )
        + "\n"
    )
    (tmp_path / "page.md").write_text(text)
    page = parse(tmp_path / "page.md", "docs/_parser_case.md")
    assert [(b.line, b.code) for b in page.blocks] == [
        (2, "x = 1\n"),
        (11, "y = x + 1\n"),
        (16, "z = 3\n"),
    ]
    assert page.fragments == [6]
    assert page.errors == [
        "docs/_parser_case.md:14: <!-- fragment --> is not directly before a ```python fence",
        "docs/_parser_case.md:24: tag the block ```python (not ```py) so that it runs or is "
        "a marked fragment",
    ]


def test_a_failing_block_is_reported_with_its_page_and_line(zygote: Zygote, tmp_path: Path) -> None:
    page = Page(
        ROOT / "docs" / "x.md",
        "docs/x.md",
        blocks=[Block(3, "a = 1\n"), Block(9, "b = a\nraise ValueError('no')\n")],
    )
    log = tmp_path / "log"
    assert zygote.run(page, tmp_path, log) == 1
    output = log.read_text()
    assert "DOCS: the block at docs/x.md:9 failed" in output
    assert 'File "' + str(ROOT / "docs" / "x.md") + '", line 11' in output  # the raise
    assert "ValueError: no" in output


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    """README.md shows the command that checks a change; .ci/run must be that command."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    shown = [
        line
        for line in readme.splitlines()
        if line.startswith("python3 -m pip install") and "pytest" in line
    ]
    assert shown == [ci]
    assert "mkdocs build --strict" in ci
