"""Registries (models, interfaces, backends, packs, optimizers, losses) and ``Spec``, on
real torch objects."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel
from runmodel.backends import AMP, Compile, Plain
from runmodel.config import registry
from runmodel.config.registry import Spec
from runmodel.models.loader import load_source
from runmodel.packs import Checkpoint, TensorBoard

from helpers import Tiny, params

HERE = str(Path(__file__).resolve())


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A registry name no other test (and no built-in) uses."""
    return f"test-{request.node.name}-{uuid.uuid4().hex[:8]}"


def place(fn: Callable[..., Any]) -> str:
    """``file:line`` of a function defined in this file (its first decorator's line)."""
    return f"{HERE}:{fn.__code__.co_firstlineno}"


# -- small real things the registries make -------------------------------------------------


class WithOptions(runmodel.Model):
    init_defaults = {"hidden": 128, "act": "relu"}

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        pass


class Made(runmodel.Model):
    """What a seed-001 style factory function returns."""

    def __init__(self, name: str, device: str | None, args: dict[str, Any]) -> None:
        super().__init__(device)
        self.name, self.args = name, args

    def run(
        self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        pass


class EmptyPack(runmodel.Pack):
    def __init__(self, **given: Any) -> None:
        self.given = given


def model_factory(name: str, device: str | None = None, **args: Any) -> Made:
    return Made(name, device, args)


def other_model_factory(name: str, device: str | None = None, **args: Any) -> Made:
    return Made(name, device, args)


# -- registering ---------------------------------------------------------------------------

REGISTERS = {
    "model": runmodel.register_model,
    "interface": runmodel.register_interface,
    "backend": runmodel.register_backend,
    "pack": runmodel.register_pack,
    "optimizer": runmodel.register_optimizer,
    "loss": runmodel.register_loss,
}


@pytest.mark.parametrize("kind", list(REGISTERS))
def test_call_form_registers_and_returns_the_factory(kind: str, name: str) -> None:
    def factory(*args: Any, **kwargs: Any) -> None:
        return None

    assert name not in registry.registries[kind]
    assert REGISTERS[kind](name, factory) is factory
    assert name in registry.registries[kind]
    assert registry.registries[kind].get(name) is factory
    assert name in registry.registries[kind].names()


@pytest.mark.parametrize("kind", list(REGISTERS))
def test_decorator_form_registers_and_returns_the_factory_unchanged(kind: str, name: str) -> None:
    def factory(*args: Any, **kwargs: Any) -> None:
        return None

    decorated = REGISTERS[kind](name)(factory)
    assert decorated is factory
    assert registry.registries[kind].get(name) is factory


def test_decorator_form_on_a_class(name: str) -> None:
    @runmodel.register_model(name)
    class Decorated(WithOptions):
        pass

    assert isinstance(Decorated, type) and issubclass(Decorated, WithOptions)
    assert registry.registries["model"].get(name) is Decorated
    assert isinstance(runmodel.make_model(name), Decorated)


def test_the_top_level_names_are_the_registry_functions() -> None:
    assert runmodel.register_model is registry.register_model
    assert registry.register_model == registry.registries["model"].register
    assert runmodel.make_model is registry.make_model
    assert runmodel.make_optimizer is registry.make_optimizer


@pytest.mark.parametrize("kind", list(REGISTERS))
def test_a_duplicate_name_names_both_places(kind: str, name: str) -> None:
    REGISTERS[kind](name, model_factory)
    with pytest.raises(ValueError) as info:
        REGISTERS[kind](name, other_model_factory)
    message = str(info.value)
    assert repr(name) in message and kind in message
    assert f"model_factory ({place(model_factory)})" in message
    assert f"other_model_factory ({place(other_model_factory)})" in message
    assert message.index("model_factory (") < message.index("other_model_factory (")
    assert registry.registries[kind].get(name) is model_factory  # the first one stays


def test_a_duplicate_by_decorator_names_both_places(name: str) -> None:
    @runmodel.register_loss(name)
    def first(*args: Any) -> None:
        return None

    with pytest.raises(ValueError) as info:

        @runmodel.register_loss(name)
        def second(*args: Any) -> None:
            return None

    message = str(info.value)
    assert f"first ({place(first)})" in message
    assert f"test_a_duplicate_by_decorator_names_both_places.<locals>.second ({HERE}:" in message
    assert registry.registries["loss"].get(name) is first


def test_a_duplicate_class_names_both_places(name: str) -> None:
    class One(WithOptions):
        pass

    class Two(WithOptions):
        pass

    runmodel.register_model(name, One)
    with pytest.raises(
        ValueError,
        match=r"One \(.*test_registry\.py:\d+\).*Two \("
        r".*test_registry\.py:\d+\)",
    ):
        runmodel.register_model(name, Two)


def test_the_same_code_run_again_replaces_silently(name: str) -> None:
    made = []
    for i in range(2):

        def factory(*args: Any, i: int = i) -> int:
            return i

        made.append(runmodel.register_loss(name, factory))
    assert made[0] is not made[1]
    assert registry.registries["loss"].get(name) is made[1]
    assert registry.registries["loss"].get(name)() == 1


def test_the_very_same_factory_twice_is_still_a_duplicate(name: str) -> None:
    runmodel.register_loss(name, model_factory)
    with pytest.raises(ValueError, match="registered already"):
        runmodel.register_loss(name, model_factory)


SOURCE = """
import runmodel


class Net(runmodel.Model):
    def run(self, runstep, steps=None, *args, **kwargs):
        pass


def build(name, device=None, **args):
    return Net(device)


runmodel.register_model({cls!r}, Net)
runmodel.register_model({fn!r}, build)


@runmodel.register_loss({loss!r})
def loss(output, target):
    return (output - target).abs().sum()
"""


def test_a_file_loaded_twice_replaces_its_registrations(tmp_path: Path, name: str) -> None:
    names = {"cls": f"{name}-cls", "fn": f"{name}-fn", "loss": f"{name}-loss"}
    path = tmp_path / "plugin.py"
    path.write_text(SOURCE.format(**names))
    first, _ = load_source(str(path))
    second, _ = load_source(str(path))
    assert first is not second and first.Net is not second.Net
    assert registry.registries["model"].get(names["cls"]) is second.Net
    assert registry.registries["model"].get(names["fn"]) is second.build
    assert registry.registries["loss"].get(names["loss"]) is second.loss
    assert isinstance(runmodel.make_model(names["cls"]), second.Net)
    assert isinstance(runmodel.make_model(names["fn"]), second.Net)


def test_another_file_taking_the_name_names_both_files(tmp_path: Path, name: str) -> None:
    names = {"cls": f"{name}-cls", "fn": f"{name}-fn", "loss": f"{name}-loss"}
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "plugin.py").write_text(SOURCE.format(**names))
    first, _ = load_source(str(tmp_path / "a" / "plugin.py"))
    with pytest.raises(ValueError) as info:
        load_source(str(tmp_path / "b" / "plugin.py"))
    message = str(info.value)
    assert f"Net ({tmp_path / 'a' / 'plugin.py'}:5)" in message
    assert f"Net ({tmp_path / 'b' / 'plugin.py'}:5)" in message
    assert registry.registries["model"].get(names["cls"]) is first.Net


def test_different_sourceless_factories_with_one_name_are_duplicates(name: str) -> None:
    first: dict[str, Any] = {}
    second: dict[str, Any] = {}
    exec(compile("def factory(*args):\n    return 1\n", "<first>", "exec"), first)
    exec(compile("def factory(*args):\n    return 2\n", "<second>", "exec"), second)
    runmodel.register_loss(name, first["factory"])
    with pytest.raises(ValueError, match="registered already"):
        runmodel.register_loss(name, second["factory"])


@pytest.mark.parametrize(
    ("kind", "builtin", "where"),
    [
        ("optimizer", "adam", "torch/optim/adam.py"),
        ("optimizer", "sgd", "torch/optim/sgd.py"),
        ("loss", "cross_entropy", "torch/nn/modules/loss.py"),
        ("backend", "plain", "runmodel/backends/base.py"),
        ("interface", "supervised", "runmodel/models/interface.py"),
        ("pack", "checkpoint", "runmodel/packs/checkpoint.py"),
    ],
)
def test_taking_a_builtins_name_fails_at_registration(kind: str, builtin: str, where: str) -> None:
    before = registry.registries[kind].get(builtin)
    with pytest.raises(ValueError, match=f"{kind} '{builtin}' is registered already") as info:
        REGISTERS[kind](builtin, model_factory)
    assert where in str(info.value) and place(model_factory) in str(info.value)
    assert registry.registries[kind].get(builtin) is before


@pytest.mark.parametrize("kind", list(REGISTERS))
@pytest.mark.parametrize("bad", [5, None, b"name", "", ("a",)])
def test_a_name_must_be_a_non_empty_string(kind: str, bad: Any) -> None:
    with pytest.raises(TypeError, match="non-empty string"):
        REGISTERS[kind](bad, model_factory)
    with pytest.raises(TypeError, match="non-empty string"):
        REGISTERS[kind](bad)


@pytest.mark.parametrize("kind", list(REGISTERS))
@pytest.mark.parametrize("bad", [5, "factory", [model_factory]])
def test_a_factory_must_be_callable(kind: str, bad: Any, name: str) -> None:
    with pytest.raises(TypeError, match=f"register_{kind}.*callable factory"):
        REGISTERS[kind](name, bad)
    with pytest.raises(TypeError, match="callable factory"):
        REGISTERS[kind](name)(bad)
    assert name not in registry.registries[kind]


# -- making --------------------------------------------------------------------------------


def test_a_model_class_gets_device_and_its_args_as_init_options(name: str) -> None:
    runmodel.register_model(name, WithOptions)
    model = runmodel.make_model(Spec(name, {"hidden": 64}), name="ignored", device="cpu")
    assert type(model) is WithOptions
    assert model.device == "cpu"
    assert model.init_options == {"hidden": 64, "act": "relu"}


def test_a_torch_model_class_is_built_on_its_device(name: str) -> None:
    runmodel.register_model(name, Tiny)
    model = runmodel.make_model({"type": name}, device="cpu")
    assert isinstance(model, Tiny) and model.device == torch.device("cpu")
    assert isinstance(model.module, nn.Linear)


@pytest.mark.parametrize(("given", "expected"), [(None, "SPEC"), ("mine", "mine")])
def test_a_factory_function_gets_name_device_and_args(
    name: str, given: str | None, expected: str
) -> None:
    runmodel.register_model(name, model_factory)
    model = runmodel.make_model(
        {"type": name, "args": {"hidden": 8, "act": "tanh"}}, name=given, device="meta"
    )
    assert isinstance(model, Made)
    assert model.name == (name if expected == "SPEC" else expected)
    assert model.device == "meta"
    assert model.args == {"hidden": 8, "act": "tanh"}


@pytest.mark.parametrize(
    ("make", "register", "expected"),
    [
        (lambda spec: runmodel.make_model(spec), runmodel.register_model, "a runmodel.Model"),
        (
            lambda spec: runmodel.make_interface(spec),
            runmodel.register_interface,
            "a runmodel.Interface",
        ),
        (lambda spec: runmodel.make_backend(spec), runmodel.register_backend, "a runmodel.Backend"),
        (lambda spec: runmodel.make_pack(spec), runmodel.register_pack, "a runmodel.Pack"),
        (
            lambda spec: runmodel.make_optimizer(spec, nn.Linear(2, 2).parameters()),
            runmodel.register_optimizer,
            "a torch.optim.Optimizer",
        ),
    ],
)
def test_a_factory_returning_the_wrong_kind_is_a_type_error(
    make: Callable[[str], Any], register: Callable[..., Any], expected: str, name: str
) -> None:
    def wrong(*args: Any, **kwargs: Any) -> list[int]:
        return [1, 2, 3]

    register(name, wrong)
    with pytest.raises(TypeError) as info:
        make(name)
    message = str(info.value)
    assert repr(name) in message
    assert f"wrong ({place(wrong)})" in message
    assert "returned list [1, 2, 3]" in message
    assert f"not {expected}" in message


@pytest.mark.parametrize(
    ("make", "register", "right", "cls"),
    [
        (
            lambda spec: runmodel.make_model(spec),
            runmodel.register_model,
            lambda *a, **k: WithOptions(),
            WithOptions,
        ),
        (
            lambda spec: runmodel.make_interface(spec),
            runmodel.register_interface,
            lambda: runmodel.Supervised(),
            runmodel.Supervised,
        ),
        (
            lambda spec: runmodel.make_backend(spec),
            runmodel.register_backend,
            lambda: Plain(),
            Plain,
        ),
        (
            lambda spec: runmodel.make_pack(spec),
            runmodel.register_pack,
            lambda: EmptyPack(),
            EmptyPack,
        ),
        (
            lambda spec: runmodel.make_optimizer(spec, [nn.Parameter(torch.zeros(1))]),
            runmodel.register_optimizer,
            lambda p: torch.optim.SGD(p, lr=1.0),
            torch.optim.SGD,
        ),
        (
            lambda spec: runmodel.make_loss(spec),
            runmodel.register_loss,
            lambda: nn.MSELoss(),
            nn.MSELoss,
        ),
    ],
)
def test_a_factory_returning_the_right_kind_is_returned(
    make: Callable[[str], Any],
    register: Callable[..., Any],
    right: Callable[..., Any],
    cls: type,
    name: str,
) -> None:
    register(name, right)
    assert type(make(name)) is cls


def test_a_loss_must_be_callable(name: str) -> None:
    runmodel.register_loss(name, lambda: 5)
    with pytest.raises(TypeError, match=f"'{name}'.*returned int 5, not a callable loss"):
        runmodel.make_loss(name)


@pytest.mark.parametrize(
    ("kind", "make", "wrong", "close"),
    [
        ("optimizer", lambda n: runmodel.make_optimizer(n, []), "sdg", "sgd"),
        ("loss", lambda n: runmodel.make_loss(n), "cross_entropi", "cross_entropy"),
        ("backend", lambda n: runmodel.make_backend(n), "amb", "amp"),
        ("pack", lambda n: runmodel.make_pack(n), "checkpoints", "checkpoint"),
        ("interface", lambda n: runmodel.make_interface(n), "supervise", "supervised"),
        ("model", lambda n: runmodel.make_model(n), "zzqqxx-nowhere", None),
        ("optimizer", lambda n: runmodel.make_optimizer({"type": n}, []), "zzqqxx-nowhere", None),
    ],
)
def test_an_unknown_name_is_a_key_error_with_a_hint(
    kind: str, make: Callable[[str], Any], wrong: str, close: str | None
) -> None:
    with pytest.raises(KeyError) as info:
        make(wrong)
    message = info.value.args[0]
    assert message.startswith(f"no {kind} registered as {wrong!r}.")
    if close is not None:
        assert f" Did you mean {close!r}? " in message
    else:
        assert "Did you mean" not in message
    assert message.endswith("Registered: " + ", ".join(registry.registries[kind].names()))


@pytest.mark.parametrize(
    ("make", "spec", "where"),
    [
        (
            lambda s: runmodel.make_optimizer(s, nn.Linear(2, 2).parameters()),
            Spec("sgd", {"lr": 0.1, "lrr": 0.1}),
            "optimizer 'sgd'",
        ),
        (lambda s: runmodel.make_loss(s), Spec("mse", {"bogus": 1}), "loss 'mse'"),
        (lambda s: runmodel.make_backend(s), Spec("amp", {"dtipe": "float16"}), "backend 'amp'"),
        (
            lambda s: runmodel.make_pack(s, directory="d"),
            Spec("checkpoint", {"evry": "1ep"}),
            "pack 'checkpoint'",
        ),
    ],
)
def test_bad_args_are_a_type_error_naming_type_and_args(
    make: Callable[[Spec], Any], spec: Spec, where: str
) -> None:
    with pytest.raises(TypeError) as info:
        make(spec)
    message = str(info.value)
    assert message.startswith(where)
    assert f"could not be made with args {spec.args}" in message
    assert isinstance(info.value.__cause__, TypeError)


def test_bad_args_for_a_factory_function_name_type_and_args(name: str) -> None:
    def strict(name: str, device: str | None = None, hidden: int = 1) -> Made:
        return Made(name, device, {"hidden": hidden})

    runmodel.register_model(name, strict)
    with pytest.raises(
        TypeError,
        match=rf"model '{name}' \(.*strict.*\) could not be made "
        r"with args \{'hiddn': 3\}",
    ):
        runmodel.make_model(Spec(name, {"hiddn": 3}))


def test_bad_args_for_a_model_class_name_the_args(name: str) -> None:
    runmodel.register_model(name, WithOptions)
    with pytest.raises(TypeError) as info:
        runmodel.make_model(Spec(name, {"hidden": "wide"}))
    assert "with args {'hidden': 'wide'}" in str(info.value)


def test_builtins_are_registered_by_name() -> None:
    names = {kind: set(reg.names()) for kind, reg in registry.registries.items()}
    assert {"sgd", "adam", "adamw", "rmsprop", "adagrad"} <= names["optimizer"]
    assert {
        "cross_entropy",
        "mse",
        "l1",
        "smooth_l1",
        "nll",
        "bce",
        "bce_with_logits",
        "huber",
    } <= names["loss"]
    assert {"plain", "amp", "compile"} <= names["backend"]
    assert "supervised" in names["interface"]
    assert {"checkpoint", "tensorboard"} <= names["pack"]


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("sgd", torch.optim.SGD),
        ("adam", torch.optim.Adam),
        ("adamw", torch.optim.AdamW),
        ("rmsprop", torch.optim.RMSprop),
        ("adagrad", torch.optim.Adagrad),
    ],
)
def test_builtin_optimizers_are_torchs(name: str, cls: type) -> None:
    module = nn.Linear(3, 2)
    optimizer = runmodel.make_optimizer(Spec(name, {"lr": 0.25}), module.parameters())
    assert type(optimizer) is cls
    assert optimizer.param_groups[0]["lr"] == 0.25
    assert optimizer.param_groups[0]["params"] == list(module.parameters())


@pytest.mark.parametrize("spec", [Spec("sgd", {"lr": 0.1}), {"type": "sgd", "args": {"lr": 0.1}}])
def test_make_optimizer_takes_a_spec_or_a_dict(spec: Any) -> None:
    module = nn.Linear(3, 2)
    optimizer = runmodel.make_optimizer(spec, module.parameters())
    assert type(optimizer) is torch.optim.SGD
    assert optimizer.param_groups[0]["lr"] == 0.1
    before = params(module)
    module(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    assert torch.allclose(
        params(module), before - 0.1 * torch.cat([p.grad.flatten() for p in module.parameters()])
    )


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("cross_entropy", nn.CrossEntropyLoss),
        ("mse", nn.MSELoss),
        ("l1", nn.L1Loss),
        ("nll", nn.NLLLoss),
        ("bce_with_logits", nn.BCEWithLogitsLoss),
        ("huber", nn.HuberLoss),
    ],
)
def test_builtin_losses_are_torchs(name: str, cls: type) -> None:
    assert type(runmodel.make_loss(name)) is cls


def test_loss_args_are_passed() -> None:
    loss = runmodel.make_loss({"type": "cross_entropy", "args": {"label_smoothing": 0.1}})
    assert isinstance(loss, nn.CrossEntropyLoss) and loss.label_smoothing == 0.1


def test_builtin_backends_and_interface() -> None:
    assert type(runmodel.make_backend("plain")) is Plain
    amp = runmodel.make_backend({"type": "amp", "args": {"dtype": "bfloat16"}})
    assert type(amp) is AMP and amp.dtype == "bfloat16"
    compiled = runmodel.make_backend(Spec("compile", {"backend": "eager"}))
    assert type(compiled) is Compile and compiled.compile_options["backend"] == "eager"
    with_optimizer = runmodel.make_backend(Spec("plain", {"optimizer": "adam"}))
    made = with_optimizer.optimizer([torch.nn.Parameter(torch.zeros(2))])
    assert type(made) is torch.optim.Adam
    assert type(runmodel.make_interface("supervised")) is runmodel.Supervised


# -- packs and their context -----------------------------------------------------------


def test_context_fills_a_pack_parameter_the_spec_leaves_out(tmp_path: Path) -> None:
    pack = runmodel.make_pack(
        Spec("checkpoint", {"every": "2ep", "keep": 3}), directory=tmp_path / "ckpt"
    )
    assert type(pack) is Checkpoint
    assert pack.directory == tmp_path / "ckpt"
    assert pack.every.text == "2ep" and pack.keep == 3
    board = runmodel.make_pack("tensorboard", directory=tmp_path / "tb")
    assert type(board) is TensorBoard and board.directory == tmp_path / "tb"


def test_context_never_overrides_the_spec(tmp_path: Path) -> None:
    pack = runmodel.make_pack(
        {"type": "checkpoint", "args": {"directory": str(tmp_path / "a")}}, directory=tmp_path / "b"
    )
    assert pack.directory == tmp_path / "a"


def test_context_is_not_passed_to_a_factory_that_does_not_take_it(name: str) -> None:
    calls: list[dict[str, Any]] = []

    def factory(every: int = 1) -> EmptyPack:
        calls.append({"every": every})
        return EmptyPack(every=every)

    runmodel.register_pack(name, factory)
    pack = runmodel.make_pack(Spec(name, {"every": 2}), directory="somewhere", other=1)
    assert calls == [{"every": 2}] and pack.given == {"every": 2}


def test_context_is_passed_to_a_factory_taking_keywords(name: str) -> None:
    runmodel.register_pack(name, EmptyPack)
    pack = runmodel.make_pack(Spec(name, {"every": 2, "other": 5}), directory="d", other=1)
    assert pack.given == {"every": 2, "other": 5, "directory": "d"}


def test_a_pack_spec_missing_a_required_argument_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"pack 'checkpoint'.*with args \{'every': '1ep'\}"):
        runmodel.make_pack(Spec("checkpoint", {"every": "1ep"}))


# -- Spec.of -------------------------------------------------------------------------------


def test_spec_of_a_spec_is_itself() -> None:
    spec = Spec("adam", {"lr": 0.1})
    assert Spec.of(spec, "optimizer") is spec


def test_spec_of_a_bare_name() -> None:
    assert Spec.of("adam", "optimizer") == Spec("adam", {})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"type": "adam"}, Spec("adam")),
        ({"type": "adam", "args": {"lr": 0.1}}, Spec("adam", {"lr": 0.1})),
        ({"args": {"lr": 0.1}, "type": "adam"}, Spec("adam", {"lr": 0.1})),
        ({"type": "adam", "args": None}, Spec("adam")),
    ],
)
def test_spec_of_a_table(value: dict[str, Any], expected: Spec) -> None:
    original = copy.deepcopy(value)
    spec = Spec.of(value, "optimizer")
    assert spec == expected
    assert value == original
    if value.get("args"):
        assert spec.args is not value["args"]  # a copy: changing the table leaves the spec


def test_spec_of_with_extra_keys_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"optimizer: unknown key\(s\) \['argz', 'lr'\]"):
        Spec.of({"type": "adam", "argz": {}, "lr": 1}, "optimizer")


@pytest.mark.parametrize("args", [[1], "lr", 5, 1.5, True, ("lr", 1)])
def test_spec_args_must_be_a_dict(args: Any) -> None:
    with pytest.raises(TypeError, match="optimizer: 'args' must be a table/dict"):
        Spec.of({"type": "adam", "args": args}, "optimizer")


@pytest.mark.parametrize("args", [[], 0, "", False])
def test_falsy_non_dict_args_are_a_type_error(args: Any) -> None:
    with pytest.raises(TypeError, match="'args' must be a table/dict"):
        Spec.of({"type": "adam", "args": args}, "optimizer")


@pytest.mark.parametrize("value", [5, None, ["adam"], {"args": {}}, {"type": 5}, 1.5, ("adam", {})])
def test_spec_of_anything_else_is_a_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match=r"backend: give a registered name or "):
        Spec.of(value, "backend")


def test_one_file_imported_by_two_spellings_of_its_path_registers_once() -> None:
    from runmodel.models import load_source

    examples = Path(__file__).resolve().parent.parent.parent / "examples"
    load_source(str(examples / "configs" / ".." / "digits.py"))
    load_source(str(examples / "digits.py"))  # a config's import, then a test's: one model
    assert runmodel.config.registry.registries["model"].get("digits").__name__ == "Digits"
