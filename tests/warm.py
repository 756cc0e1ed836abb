"""``subprocess``, with a Python command's child forked from a warm interpreter.

Importing torch costs a process about 3 s of CPU, most of what a small test run costs: the
suite starts hundreds of processes. ``warm.Popen`` and ``warm.run`` take the arguments of
``subprocess.Popen`` and ``subprocess.run``; a command ``[sys.executable, script, ...]``,
``[sys.executable, "-m", module, ...]`` or ``[sys.executable, "-c", code, ...]`` (no other
interpreter option) is forked from a server process that imported torch once (the
"zygote"), and then runs as ``python`` would run it: its own process and pid, its own
session when asked, its stdin/stdout/stderr, working directory, environment,
``sys.argv``, ``sys.path`` and ``__main__``, real signals (SIGKILL, SIGTERM, Ctrl-C), its
exit code or the signal that ended it. Every other command is a plain ``subprocess``
child. A module uses it as ``import warm as subprocess``.

What differs from a fresh interpreter: the modules the zygote imported (torch, what
torch imports, and torch._dynamo, which constructing a torch.optim optimizer imports) are
there already, with what they read from the environment at import (the zygote's: one
OpenMP thread); the hash seed is the zygote's. A test of what a fresh
interpreter imports, or of the interpreter's own start, uses ``subprocess`` itself.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from subprocess import (
    DEVNULL,
    PIPE,
    STDOUT,
    CalledProcessError,
    CompletedProcess,
    SubprocessError,
    TimeoutExpired,
)
from typing import Any

__all__ = [
    "DEVNULL",
    "PIPE",
    "STDOUT",
    "CalledProcessError",
    "CompletedProcess",
    "Popen",
    "SubprocessError",
    "TimeoutExpired",
    "run",
]

#: The zygote: imports torch, then forks a child for each request on its socket and
#: reports each child's pid, then its wait status, on the same socket.
ZYGOTE = r"""
import io, json, os, runpy, select, signal, socket, sys, types
import torch  # what every child shares
import torch._dynamo  # (constructing a torch.optim optimizer imports it: 1.5 CPU-s)

# It ends with its test process by the end of its socket, not by PR_SET_PDEATHSIG: that
# signal comes when the *thread* that started it ends, and the first test to use it may
# do so from a thread of its own.

requests = socket.socket(fileno=int(sys.argv[1]))
base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
reaped_r, reaped_w = os.pipe()
os.set_blocking(reaped_w, False)
signal.set_wakeup_fd(reaped_w)
signal.signal(signal.SIGCHLD, lambda *_: None)


def stream(fd, mode):
    encoding, _, errors = os.environ.get("PYTHONIOENCODING", "").partition(":")
    raw = io.FileIO(fd, mode, closefd=False)
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding or "utf-8",
                                errors=errors or "strict")
    return io.TextIOWrapper(
        io.BufferedWriter(raw), encoding=encoding or "utf-8",
        errors=errors or ("backslashreplace" if fd == 2 else "strict"),
        line_buffering=raw.isatty(), write_through=bool(os.environ.get("PYTHONUNBUFFERED")))


def child(job, fds):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    requests.close()
    os.close(reaped_r), os.close(reaped_w)
    if job["session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    if job["cwd"]:
        os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    sys.stdin = sys.__stdin__ = stream(0, "r")
    sys.stdout = sys.__stdout__ = stream(1, "w")
    sys.stderr = sys.__stderr__ = stream(2, "w")
    kind, target, args = job["kind"], job["target"], job["args"]
    if kind == "script":
        first = os.path.dirname(os.path.abspath(target))
    else:  # as python -m and -c: the working directory
        first = os.getcwd() if kind == "module" else ""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *map(os.path.abspath, extra), *base_path]
    code = 0
    try:
        if kind == "module":
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "code":
            sys.argv = ["-c", *args]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:
            sys.argv = [target, *args]
            runpy.run_path(target, run_name="__main__")
    except SystemExit as error:
        if error.code is None:
            code = 0
        elif isinstance(error.code, int):
            code = error.code
        else:
            print(error.code, file=sys.stderr)
            code = 1
    except BaseException as error:  # as Python: the excepthook, from the first frame of the
        # program's own (not this zygote's, nor runpy's)
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in ("<zygote>", "<frozen runpy>"):
            tb = tb.tb_next
        sys.excepthook(type(error), error, tb)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    try:
        import threading
        threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
    finally:
        for out in (sys.stdout, sys.stderr):
            try:
                out.flush()
            except Exception:
                pass
    if code < 0:  # as Python ends on a KeyboardInterrupt nobody caught: by the signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        requests.sendall((json.dumps({"pid": pid, "status": status}) + "\n").encode())


requests.sendall(b'{"ready": true}\n')
while True:
    try:
        ready, _, _ = select.select([requests, reaped_r], [], [])
    except InterruptedError:
        continue
    if reaped_r in ready:
        os.read(reaped_r, 4096)
        reap()
    if requests in ready:
        data, fds, _, _ = socket.recv_fds(requests, 1 << 20, 3)
        if not data:
            break
        job = json.loads(data)
        pid = os.fork()
        if pid == 0:
            try:
                child(job, fds)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        requests.sendall((json.dumps({"started": job["id"], "pid": pid}) + "\n").encode())
        reap()
"""


#: Runs ZYGOTE under its own file name, which the children's tracebacks leave out.
BOOT = "import sys; exec(compile(sys.argv[2], '<zygote>', 'exec'))"


class _Zygote:
    """The zygote of this test process, started at its first use; a thread reads what it
    reports."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
        env.pop("COLUMNS", None)
        self.process = subprocess.Popen(
            [sys.executable, "-c", BOOT, str(theirs.fileno()), ZYGOTE],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=DEVNULL,
        )
        theirs.close()
        self.socket = ours
        self.lock = threading.Lock()  # one request at a time
        self.changed = threading.Condition()
        self.started: dict[int, int] = {}  # request id: pid
        self.ended: dict[int, int] = {}  # pid: wait status
        self.next_id = 0
        assert json.loads(self.socket.recv(4096)) == {"ready": True}, "the zygote did not start"
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.socket.recv(1 << 16)
            except OSError:
                data = b""
            with self.changed:
                if not data:  # the zygote is gone: its children cannot be waited for
                    self.ended = _Gone(self.ended)
                    self.changed.notify_all()
                    return
                for line in data.decode().splitlines():
                    message = json.loads(line)
                    if "started" in message:
                        self.started[message["started"]] = message["pid"]
                    else:
                        self.ended[message["pid"]] = message["status"]
                self.changed.notify_all()

    def start(self, job: dict[str, Any], fds: list[int]) -> int:
        with self.lock:
            self.next_id += 1
            job["id"] = self.next_id
            socket.send_fds(self.socket, [json.dumps(job).encode()], fds)
            with self.changed:
                self.changed.wait_for(lambda: job["id"] in self.started, timeout=60)
                return self.started.pop(job["id"])

    def status(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s wait status, waiting up to ``timeout`` s (0: not at all) for it."""
        with self.changed:
            self.changed.wait_for(lambda: pid in self.ended, timeout=timeout)
            return self.ended.pop(pid, None)

    def close(self) -> None:
        self.socket.shutdown(socket.SHUT_RDWR)  # ends the reading thread's recv, then the zygote
        self.socket.close()
        try:
            self.process.wait(timeout=30)
        except TimeoutExpired:
            self.process.kill()


class _Gone(dict):  # type: ignore[type-arg]
    """The statuses once the zygote is gone: a child not yet reported ended unknown."""

    def __contains__(self, pid: object) -> bool:
        return True

    def pop(self, pid: Any, default: Any = None) -> Any:
        return super().pop(pid, 0)


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _the_zygote() -> _Zygote:
    """This test process's zygote; a new one where the last one ended (killed from
    outside: the tests that used it fail, the next ones do not fail for it)."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.process.poll() is not None:
            _zygote = _Zygote()
            atexit.register(_zygote.close)
        return _zygote


def _python_command(args: Any) -> tuple[str, str, list[str]] | None:
    """(kind, target, arguments) of a command the zygote runs, or None (and always None
    with ``RUNMODEL_TESTS_COLD=1`` in the environment: every child a fresh interpreter)."""
    if os.environ.get("RUNMODEL_TESTS_COLD") == "1":
        return None
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence) or len(args) < 2:
        return None
    words = [os.fspath(a) for a in args]
    if words[0] != sys.executable:
        return None
    if words[1] == "-m" and len(words) > 2:
        return "module", words[2], words[3:]
    if words[1] == "-c" and len(words) > 2:
        return "code", words[2], words[3:]
    if not words[1].startswith("-"):
        return "script", words[1], words[2:]
    return None


class Popen(subprocess.Popen):  # type: ignore[type-arg]
    """``subprocess.Popen``; a Python command's child forked from the zygote."""

    def __init__(self, args: Any, *rest: Any, **options: Any) -> None:
        self._forked = _python_command(args) if not rest else None
        unsupported = ("preexec_fn", "pass_fds", "executable", "shell", "user", "group")
        if any(options.get(name) for name in unsupported):
            self._forked = None
        super().__init__(args, *rest, **options)

    def _execute_child(  # type: ignore[override]
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: Any,
        pass_fds: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: Any,
        shell: Any,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        restore_signals: Any,
        gid: Any,
        gids: Any,
        uid: Any,
        umask: Any,
        start_new_session: bool,
        *more: Any,
    ) -> None:
        if self._forked is None:
            return super()._execute_child(  # type: ignore[misc]
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                errwrite, restore_signals, gid, gids, uid, umask, start_new_session, *more,
            )  # fmt: skip
        kind, target, arguments = self._forked
        process_group = more[0] if more else -1
        job = {
            "kind": kind,
            "target": target,
            "args": arguments,
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "env": {os.fsdecode(k): os.fsdecode(v) for k, v in (env or os.environ).items()},
            "session": bool(start_new_session) or process_group == 0,
        }
        fds = [p2cread, c2pwrite, errwrite]
        fds = [fd if fd != -1 else n for n, fd in enumerate(fds)]  # -1: this process's own
        self._zygote = _the_zygote()  # (its children are its own to report)
        try:
            self.pid = self._zygote.start(job, fds)
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]
        self._child_created = True

    def _internal_poll(self, _deadstate: Any = None, *_: Any, **__: Any) -> int | None:
        if self._forked is None:
            return super()._internal_poll(_deadstate)  # type: ignore[misc]
        if self.returncode is None:
            status = self._zygote.status(self.pid, 0)
            if status is not None:
                self._handle_exitstatus(status)  # type: ignore[attr-defined]
        return self.returncode

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        if self._forked is None:
            return super()._try_wait(wait_flags)  # type: ignore[misc]
        status = self._zygote.status(self.pid, 0 if wait_flags & os.WNOHANG else None)
        return (0, 0) if status is None else (self.pid, status)


def run(
    *popenargs: Any,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> CompletedProcess[Any]:
    """``subprocess.run``, with ``Popen`` above."""
    if input is not None:
        kwargs["stdin"] = PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = PIPE
    with Popen(*popenargs, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except TimeoutExpired:
            process.kill()
            process.wait()
            raise
        except BaseException:
            process.kill()
            raise
        code = process.poll()
        if check and code:
            raise CalledProcessError(code, process.args, output=stdout, stderr=stderr)
    return CompletedProcess(process.args, code, stdout, stderr)
