"""The model contract: what the engine runs, and the options it is given."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ..config.overrides import unknown_option, unknown_option_text

if TYPE_CHECKING:
    from ..core import RunStep

__all__ = [
    "Model",
    "declared_options",
    "resolve_options",
    "setup_options_for",
    "unknown_option_text",
]


def resolve_options(
    owner: object, kind: str, given: Mapping[str, Any] | None, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """``defaults`` updated with the known keys of ``given``.

    An unknown key is ignored with one warning (a model must not fail on an option it
    does not know: ``config.overrides.unknown_option``); a known key with a value of the
    wrong type is an error.
    """
    name = type(owner).__name__
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise TypeError(f"{name}: {kind}_options must be a dict or None, got {given!r}")
    resolved = dict(defaults)
    for key, value in given.items():
        if key not in defaults:
            unknown_option("python", name, kind, key, defaults, stacklevel=3)
            continue
        resolved[key] = _checked(name, kind, key, value, defaults[key])
    return resolved


def declared_options(
    owner: object, kind: str, given: Mapping[str, Any] | None, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """Options resolved against what the model declares; passed through when it declares
    nothing (it reads them itself, so none can be called unknown)."""
    if defaults:
        return resolve_options(owner, kind, given, defaults)
    if given is not None and not isinstance(given, Mapping):
        raise TypeError(
            f"{type(owner).__name__}: {kind}_options must be a dict or None, got {given!r}"
        )
    return dict(given or {})


def setup_options_for(model: object, given: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What ``model.setup`` is given for the setup options ``given``: checked against the
    options ``model`` declares (``setup_defaults``) and completed with their defaults, as
    every caller of ``setup`` (a run, an export) gives them; None where nothing is given
    and nothing declared."""
    defaults = getattr(model, "setup_defaults", None)
    if given is None and not defaults:
        return None
    return declared_options(model, "setup", given, defaults or {})


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
        raise TypeError(
            f"{owner}: {kind} option {key!r} must be "
            f"{' or '.join(t.__name__ for t in expected)} (like its default "
            f"{default!r}), got {value!r}"
        )
    return float(value) if isinstance(default, float) else value


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

    def __init__(
        self, device: str | None = None, init_options: dict[str, Any] | None = None
    ) -> None:
        self.device: Any = device
        self.init_options = declared_options(self, "init", init_options, self.init_defaults)

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
        raise NotImplementedError(
            f"{type(self).__name__} must define step(batch) to say what "
            f"one runstep does (or derive from runmodel.TorchModel)"
        )

    def teardown(self) -> None:
        """Clean up after a run."""
