"""Small real models and data that many tests share.

``import helpers`` works from every folder under tests/: tests/conftest.py puts tests/ on
``sys.path``. Fixtures (``engine``, ``device``) stay in conftest.py.

Models here default to the CPU, whatever the machine has: a test that means CUDA as well
takes the ``device`` fixture and passes it on. Data is made on the CPU; the models' loop
moves each batch to the model's device.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

import runmodel
from runmodel.core.phases import PHASES
from runmodel.packs import Checkpoint

import warm as subprocess

__all__ = [
    "Counting",
    "Tiny",
    "assert_equal_params",
    "assert_same",
    "build_module",
    "dropout_mlp",
    "files",
    "make_data",
    "params",
    "plain_sgd",
    "record_all",
    "train_with_checkpoints",
]

Batches = list[tuple[torch.Tensor, torch.Tensor]]

#: The regression target's weights, repeated for more features: y = x @ w + BIAS.
WEIGHTS = (1.0, -2.0, 0.5, 3.0)
BIAS = 0.25


# -- data ------------------------------------------------------------------------------------


def make_data(
    batches: int = 4,
    batch_size: int = 8,
    features: int = 4,
    *,
    classes: int | None = None,
    seed: int = 0,
) -> Batches:
    """``batches`` batches of ``batch_size`` rows of ``features`` standard normal inputs,
    the same for the same arguments, on the CPU.

    The target is ``x @ w + 0.25`` as one column (regression, ``classes=None``;
    ``w = 1, -2, 0.5, 3, 1, -2, ...``), or with ``classes=k`` the number of the first
    ``k - 1`` features that are positive: a class in ``0 .. k-1`` (int64).
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batches * batch_size, features, generator=g)
    if classes is None:
        w = torch.tensor([WEIGHTS[i % len(WEIGHTS)] for i in range(features)]).unsqueeze(1)
        y = x @ w + BIAS
    else:
        if not 2 <= classes <= features + 1:
            raise ValueError(f"classes={classes}: between 2 and features + 1 ({features + 1})")
        y = (x[:, : classes - 1] > 0).sum(1)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)]


# -- models ----------------------------------------------------------------------------------


def build_module(
    features: int, outputs: int, hidden: int | None = None, dropout: float | None = None
) -> nn.Module:
    """``Linear(features, outputs)``; with ``hidden``, ``Linear -> ReLU -> Linear``, or
    ``Linear -> Dropout(dropout) -> Linear`` with ``dropout`` (a layer that draws random
    numbers: an exact resume needs the generator's state). Built as torch's generator
    is: seed it first for the same weights."""
    if hidden is None:
        return nn.Linear(features, outputs)
    middle = nn.ReLU() if dropout is None else nn.Dropout(dropout)
    return nn.Sequential(nn.Linear(features, hidden), middle, nn.Linear(hidden, outputs))


class Tiny(runmodel.TorchModel):
    """A small model trained on ``make_data()``: a regression (MSE) or, with ``classes``,
    a classifier (cross-entropy).

    The module (``build_module``) is made after ``torch.manual_seed(0)``, so two models
    with the same arguments start from the same weights. ``setup`` makes the optimizer
    (``optimizer`` called with the parameters and ``lr``), the loss, ``train_data``
    (``data`` if given, else ``make_data(batches, batch_size, features, classes=classes)``)
    and ``eval_data`` (``eval_batches`` batches, default ``batches``, of other data: seed
    1). ``calls`` records ``model.setup`` and ``model.teardown``.
    """

    def __init__(
        self,
        device: str | torch.device | None = "cpu",
        init_options: dict[str, Any] | None = None,
        *,
        classes: int | None = None,
        features: int = 4,
        hidden: int | None = None,
        dropout: float | None = None,
        batches: int = 4,
        batch_size: int = 8,
        eval_batches: int | None = None,
        optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
        lr: float = 0.1,
        data: Iterable[Any] | None = None,
    ) -> None:
        super().__init__(device, init_options)
        self.classes, self.features, self.batches, self.batch_size = (
            classes,
            features,
            batches,
            batch_size,
        )
        self.eval_batches = batches if eval_batches is None else eval_batches
        self.make_optimizer, self.lr, self.data = optimizer, lr, data
        self.calls: list[str] = []
        torch.manual_seed(0)
        self.module = build_module(features, 1 if classes is None else classes, hidden, dropout)

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        self.calls.append("model.setup")
        self.optimizer = self.make_optimizer(self.module.parameters(), lr=self.lr)
        self.loss_fn = nn.MSELoss() if self.classes is None else nn.CrossEntropyLoss()
        shape = (self.batch_size, self.features)
        self.train_data = (
            make_data(self.batches, *shape, classes=self.classes)
            if self.data is None
            else self.data
        )
        self.eval_data = make_data(self.eval_batches, *shape, classes=self.classes, seed=1)

    def teardown(self) -> None:
        self.calls.append("model.teardown")


def plain_sgd(
    module: nn.Module,
    data: Iterable[tuple[torch.Tensor, torch.Tensor]],
    lr: float,
    epochs: int = 1,
    steps: int | None = None,
    accumulate: int = 1,
) -> nn.Module:
    """``module`` trained by hand: MSE loss, ``SGD(lr)`` stepped every ``accumulate``
    batches, ``epochs`` passes over ``data`` or its first ``steps`` batches; the batches
    moved to the module's device. The reference a train run must match."""
    device = next(module.parameters()).device
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    done = 0
    for _ in range(epochs):
        for x, y in data:
            if done == steps:
                return module
            nn.functional.mse_loss(module(x.to(device)), y.to(device)).backward()
            done += 1
            if done % accumulate == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    return module


def dropout_mlp(device: str | torch.device = "cpu") -> Tiny:
    """A regression through ``Linear(4, 8) -> Dropout(0.25) -> Linear(8, 1)``, Adam(lr=0.05),
    on 4 batches of 8: an exact resume needs its weights, the optimizer's state and the
    random number generator's state (dropout draws from it)."""
    return Tiny(device, hidden=8, dropout=0.25, optimizer=torch.optim.Adam, lr=0.05)


def train_with_checkpoints(
    directory: str | os.PathLike[str],
    epochs: int = 2,
    *,
    device: str = "cpu",
    engine: runmodel.Engine | None = None,
    **options: Any,
) -> tuple[Tiny, runmodel.Engine]:
    """``dropout_mlp(device)`` trained for ``epochs`` on ``engine`` (a new one by default)
    with ``Checkpoint(directory, **options)`` attached."""
    model, engine = dropout_mlp(device), engine or runmodel.Engine()
    engine.attach(Checkpoint(directory, **options))
    engine.run(model, epochs=epochs)
    return model, engine


class Counting(runmodel.Model):
    """A plain model (no torch) whose step records its batch and returns it; its loop
    runs ``epochs`` x ``batches`` steps on ``(epoch, b)``, or ``batches`` steps on ``b``
    without ``runstep.epochs()`` (``use_epochs=False``)."""

    def __init__(self, batches: int = 4, use_epochs: bool = True) -> None:
        super().__init__()
        self.batches, self.use_epochs = batches, use_epochs
        self.seen: list[Any] = []
        self.calls: list[str] = []

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        self.calls.append("model.setup")

    def step(self, batch: Any) -> Any:
        self.seen.append(batch)
        return batch

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        self.calls.append("model.run")
        if self.use_epochs:
            for epoch in runstep.epochs():
                for b in range(self.batches):
                    runstep((epoch, b))
        else:
            for b in range(self.batches):
                runstep(b)

    def teardown(self) -> None:
        self.calls.append("model.teardown")


def record_all(engine: runmodel.Engine, log: list[str]) -> None:
    """Hook every phase with a recorder that logs ``phase@epoch.step``."""
    for phase in PHASES:

        def recorder(engine: runmodel.Engine, phase: str = phase) -> None:
            s = engine.state
            log.append(f"{phase}@{s.epoch}.{s.step}")

        engine.on(phase, recorder, name=f"rec_{phase}")


# -- comparing -------------------------------------------------------------------------------


def params(model: nn.Module | runmodel.TorchModel) -> torch.Tensor:
    """Every parameter of a module (or of a ``TorchModel``'s module), flattened into one
    new tensor: a copy that later steps leave as it is."""
    module = model.module if isinstance(model, runmodel.TorchModel) else model
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def assert_equal_params(
    a: nn.Module | runmodel.TorchModel, b: nn.Module | runmodel.TorchModel
) -> None:
    """The same parameters, bit for bit (and on the same device)."""
    pa, pb = params(a), params(b)
    assert pa.device == pb.device, (pa.device, pb.device)
    assert torch.equal(pa, pb)


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    """Nested dicts, lists and tuples of tensors and plain values, compared exactly."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a, key=str) == sorted(b, key=str), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def files(directory: str | os.PathLike[str]) -> list[str]:
    """The names in ``directory``, sorted."""
    return sorted(os.listdir(directory))


def default_ctrl_c() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT: Ctrl-C as a terminal
    delivers it (default disposition, not blocked), whatever the test process holds. A
    child inherits an ignored SIGINT, and Python then never raises KeyboardInterrupt."""
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_when_ready(
    args: list[str],
    cwd: Any,
    send: signal.Signals,
    *,
    env: dict[str, str],
    timeout: float,
    group: bool = True,
    close_output: bool = False,
) -> tuple[int, str]:
    """Run ``args`` (in a session of its own, Ctrl-C as a terminal delivers it); once it
    prints "ready", send it ``send`` (to its process group, as a terminal or a scheduler
    does, or with ``group=False`` to the process alone); its exit status and stderr.
    ``close_output``: its stdout and stderr are one pipe, closed before the signal (``|
    tee`` ended by the same Ctrl-C). Past ``timeout`` seconds it is SIGKILLed."""
    import threading

    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if close_output else subprocess.PIPE,
        text=True,
        preexec_fn=default_ctrl_c,
        start_new_session=True,
    )
    watchdog = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) != "ready\n":
            assert line, f"ended before it was ready: {proc.communicate()}"
        if close_output:
            proc.stdout.close()
        if group:
            os.killpg(proc.pid, send)
        else:
            proc.send_signal(send)
        err = "" if close_output else proc.communicate(timeout=timeout)[1]
        proc.wait(timeout=timeout)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err


def finish_group(process: subprocess.Popen[str], limit_s: float) -> tuple[str, str]:
    """``process.communicate()`` within ``limit_s``; past it, the process and all it
    started (it was started with ``start_new_session=True``) are SIGKILLed first."""
    try:
        return process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.communicate()


# -- the small classifier of the torchrun tests' child scripts ------------------------------
# Source text, put into a child script's (dedented) text in place of a line
# ``CHILD_DATASETS`` or ``CHILD_NET``; the script imports torch, nn, DataLoader,
# TensorDataset and runmodel and sets N, EVAL_N, FEATURES and CLASSES before it.

#: ``datasets()``: N training and EVAL_N eval points of FEATURES features, CLASSES classes.
CHILD_DATASETS = """\
def datasets():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N + EVAL_N, FEATURES, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x[:N], y[:N]), TensorDataset(x[N:], y[N:])
"""

#: ``datasets()`` and ``Net``, a TorchModel with an MLP, SGD and the eval data.
CHILD_NET = (
    CHILD_DATASETS
    + """

class Net(runmodel.TorchModel):
    setup_defaults = {"batch_size": 4}

    def __init__(self, device=None, init_options=None):
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(),
                                    nn.Linear(32, CLASSES))

    def setup(self, setup_options=None):
        options = setup_options or self.setup_defaults
        train, test = datasets()
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        self.train_data = DataLoader(train, batch_size=options["batch_size"], shuffle=True)
        self.eval_data = DataLoader(test, batch_size=8)
"""
)


def with_child_net(script: str) -> str:
    """``script`` with its ``CHILD_DATASETS``/``CHILD_NET`` line replaced by the source."""
    return script.replace("CHILD_NET\n", CHILD_NET).replace("CHILD_DATASETS\n", CHILD_DATASETS)


#: What every train run's folder holds (a script's ``run_dir=`` run, a config run), with the
#: default packs (checkpoints, TensorBoard events); a config run has its config.json too.
RUN_FOLDER = [
    ".runmodel-reserve",
    "checkpoint",
    "metrics.json",
    "model.pt",
    "run.json",
    "run.log",
    "status.json",
    "tensorboard",
]
