"""The model contract (seed 000) and a ready wrapper for ``torch.nn.Module``s."""

from __future__ import annotations

import abc
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from .interface import Interface, Supervised

if TYPE_CHECKING:
    from ignite.metrics import Metric

    from .state import RunStep

__all__ = ["Model", "TorchModel", "resolve_options", "torch_device", "unwrap"]


def unwrap(module: nn.Module | None) -> nn.Module | None:
    """The module itself when ``torch.compile`` wrapped it (its state dict's keys are the
    original module's)."""
    return getattr(module, "_orig_mod", module)


def resolve_options(owner: object, kind: str, given: Mapping[str, Any] | None,
                    defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` updated with the known keys of ``given``.

    An unknown key is ignored with one warning (seed 000: a model must not fail on an
    option it does not know); a known key with a value of the wrong type is an error.
    """
    name = type(owner).__name__
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise TypeError(f"{name}: {kind}_options must be a dict or None, got {given!r}")
    resolved = dict(defaults)
    for key, value in given.items():
        if key not in defaults:
            known = ", ".join(sorted(defaults)) or "none"
            warnings.warn(f"{name}: unknown {kind} option {key!r} ignored (known: {known})",
                          UserWarning, stacklevel=3)
            continue
        resolved[key] = _checked(name, kind, key, value, defaults[key])
    return resolved


def _declared(owner: object, kind: str, given: Mapping[str, Any] | None,
              defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Options resolved against what the model declares; passed through when it declares
    nothing (it reads them itself, so none can be called unknown)."""
    if defaults:
        return resolve_options(owner, kind, given, defaults)
    if given is not None and not isinstance(given, Mapping):
        raise TypeError(f"{type(owner).__name__}: {kind}_options must be a dict or None, "
                        f"got {given!r}")
    return dict(given or {})


def _checked(owner: str, kind: str, key: str, value: Any, default: Any) -> Any:
    if default is None:  # no default to go by: any value
        return value
    expected: tuple[type, ...] = (type(default),)
    if isinstance(default, float):
        expected = (float, int)
    elif isinstance(default, (list, tuple)):
        expected = (list, tuple)
    ok = isinstance(value, expected) and (isinstance(value, bool) == isinstance(default, bool))
    if not ok:
        raise TypeError(f"{owner}: {kind} option {key!r} must be "
                        f"{' or '.join(t.__name__ for t in expected)} (like its default "
                        f"{default!r}), got {value!r}")
    return float(value) if isinstance(default, float) else value


def torch_device(device: str | torch.device | None) -> torch.device:
    """The device asked for, checked: an unknown or absent device is a clear error.
    ``None`` picks CUDA when there is one, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device {device!r} is not a device torch knows ({error}); use "
                         f"'cpu', 'cuda', 'cuda:N' or 'mps'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ValueError(f"device {device!r} asked for, but no CUDA device is available "
                             f"(torch {torch.__version__}, {build}); use device='cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} asked for, but there are only "
                             f"{torch.cuda.device_count()} CUDA devices")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} asked for, but MPS is not available here")
    return dev


class Model(abc.ABC):
    """What the engine runs.

    ``__init__`` builds the static model cheaply, ``setup`` prepares everything a run
    needs, ``run`` is the model's own loop, which calls the ``runstep`` it is handed once
    per step, and ``teardown`` cleans up; the engine calls ``teardown`` whenever it called
    ``setup``. ``init_defaults``/``setup_defaults`` declare the options a model knows:
    ``self.init_options`` and the dict ``setup`` receives hold them with the given values.
    """

    init_defaults: ClassVar[dict[str, Any]] = {}
    setup_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, device: str | None = None,
                 init_options: dict[str, Any] | None = None) -> None:
        self.device: Any = device
        self.init_options = _declared(self, "init", init_options, self.init_defaults)

    def model(self) -> Any:
        """The native network; cheap, and valid without ``setup()``."""
        return None

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        """Prepare for running: data, optimizer, anything not needed to describe the model."""

    @abc.abstractmethod
    def run(self, runstep: RunStep, steps: int | None = None, *args: Any, **kwargs: Any) -> None:
        """The model's loop: call ``runstep(batch)`` once per step, inside
        ``for epoch in runstep.epochs():`` to mark epochs. The engine stops the loop once
        ``steps`` steps ran, even if it never counts them."""

    def step(self, batch: Any) -> Any:
        """What one step does for a model that is not a ``TorchModel`` (in every mode);
        its return value becomes ``engine.state.output``."""
        raise NotImplementedError(f"{type(self).__name__} must define step(batch) to say what "
                                  f"one runstep does (or derive from runmodel.TorchModel)")

    def teardown(self) -> None:
        """Clean up after a run."""


class TorchModel(Model):
    """A ``Model`` for ``torch.nn.Module``s: set ``module`` in ``__init__`` and
    ``optimizer``, ``loss_fn``, ``train_data`` (and ``eval_data``) in ``setup``.

    ``module`` lives on ``self.device``: assigning it moves it there. The parts of a step
    are methods a subclass may override: ``compute_output(batch)``, ``target(batch)``,
    ``compute_loss(output, batch)`` and ``metrics()``; ``interface`` (default
    ``Supervised()``) may be replaced by another ``Interface``. By default a batch is
    ``(inputs, target)``; batches of tensors, tuples, lists and dicts are moved to the
    device by the default loop.
    """

    interface: Interface = Supervised()
    optimizer: torch.optim.Optimizer | None = None
    loss_fn: Callable[..., torch.Tensor] | None = None
    train_data: Iterable[Any] | None = None
    eval_data: Iterable[Any] | None = None
    infer_data: Iterable[Any] | None = None

    def __init__(self, device: str | torch.device | None = None,
                 init_options: dict[str, Any] | None = None) -> None:
        super().__init__(None, init_options)
        self.device = torch_device(device)
        self.module = getattr(self, "_module", None)  # one set before this moves too

    @property
    def module(self) -> nn.Module | None:
        return self._module

    @module.setter
    def module(self, module: nn.Module | None) -> None:
        device = getattr(self, "device", None)
        self._module = module.to(device) if module is not None and device is not None else module

    def model(self) -> nn.Module | None:
        return self.module

    def data_for(self, kind: str) -> Iterable[Any]:
        """The data a step of ``kind`` (``train``, ``eval``, ``infer``) reads."""
        data = {"train": self.train_data, "eval": self.eval_data,
                "infer": self.infer_data if self.infer_data is not None else self.eval_data}[kind]
        if data is None:
            wanted = {"train": "train_data", "eval": "eval_data",
                      "infer": "infer_data or eval_data"}[kind]
            raise ValueError(f"{type(self).__name__} has no {wanted} for a {kind} step; "
                             f"set it in setup()")
        return data

    def run(self, runstep: RunStep, steps: int | None = None, *args: Any, **kwargs: Any) -> None:
        data = self.data_for(runstep.kind)
        move = None if self.device.type == "cpu" else self.to_device
        for _ in runstep.epochs():
            for batch in data:
                runstep(batch if move is None else move(batch))

    def to_device(self, batch: Any) -> Any:
        """``batch`` with every tensor in it (through tuples, lists, dicts) on the device."""
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, dict):
            return {k: self.to_device(v) for k, v in batch.items()}
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
            return type(batch)(*(self.to_device(v) for v in batch))
        if isinstance(batch, (list, tuple)):
            return type(batch)(self.to_device(v) for v in batch)
        return batch

    def compute_output(self, batch: Any) -> Any:
        """The module's output for a batch; by default ``module(batch[0])``."""
        return self.module(batch[0])

    def target(self, batch: Any) -> Any:
        """What the output is compared with; by default ``batch[1]``."""
        return batch[1]

    def compute_loss(self, output: Any, batch: Any) -> torch.Tensor:
        """The loss of ``output``; by default ``loss_fn(output, target(batch))``."""
        return self.loss_fn(output, self.target(batch))

    def metrics(self) -> dict[str, Metric]:
        """pytorch-ignite metrics that eval mode computes, fed ``(output, target)``.

        By default the loss (with ``loss_fn``) and, for classification losses
        (cross-entropy, NLL), the accuracy; accumulated on the model's device so that
        updating them never synchronises it.
        """
        from ignite.metrics import Accuracy, Loss

        found: dict[str, Metric] = {}
        if self.loss_fn is not None:
            found["loss"] = Loss(self.loss_fn, device=self.device)
        if isinstance(self.loss_fn, (nn.CrossEntropyLoss, nn.NLLLoss)):
            found["accuracy"] = Accuracy(device=self.device)
        return found
