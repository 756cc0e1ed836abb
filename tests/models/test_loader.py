"""``runmodel.load_model`` and ``load_model_class``: real model files and packages written
to a temporary directory and imported for real."""

from __future__ import annotations

import itertools
import pickle
import re
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import runmodel
from runmodel.models.loader import load_model_class

_unique = itertools.count()

HEADER = "from __future__ import annotations\n\nimport runmodel\n\n"

#: A concrete model in a few lines; ``{name}`` and ``{base}`` are filled in.
MODEL = """
class {name}({base}):
    def step(self, batch):
        return batch

    def run(self, runstep, steps=None, *args, **kwargs):
        for _ in runstep.epochs():
            runstep(0)
"""


def write(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def models(*names: str, base: str = "runmodel.Model") -> str:
    return "".join(MODEL.format(name=n, base=base) for n in names)


def new_source_modules(before: set[str], stem: str) -> list[str]:
    return sorted(k for k in set(sys.modules) - before if k.startswith(f"runmodel_source_{stem}_"))


# -- path/file.py: the one Model subclass the file defines --------------------------------


def test_a_file_with_one_model_loads_it_and_constructs_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "single.py",
        """
        CONSTRUCTED = []

        class Single(runmodel.Model):
            init_defaults = {"width": 2, "name": "x"}

            def __init__(self, device=None, init_options=None):
                super().__init__(device, init_options)
                CONSTRUCTED.append((device, dict(self.init_options)))

            def step(self, batch):
                return batch

            def run(self, runstep, steps=None, *args, **kwargs):
                for _ in runstep.epochs():
                    runstep(0)
    """,
    )
    model = runmodel.load_model(str(path), device="cpu", init_options={"width": 3})
    cls = type(model)
    assert cls.__name__ == "Single"
    assert issubclass(cls, runmodel.Model)
    assert cls.__module__.startswith("runmodel_source_single_")
    module = sys.modules[cls.__module__]  # registered: pickling and tracebacks find it
    assert module.__file__ == str(path)
    assert module.CONSTRUCTED == [("cpu", {"width": 3, "name": "x"})]
    assert model.device == "cpu"
    assert model.init_options == {"width": 3, "name": "x"}
    # the loaded model runs
    result = runmodel.Engine().run(model, epochs=2)
    assert (result.ended, result.steps, result.epochs) == ("completed", 2, 2)


def test_load_model_class_returns_the_class_without_constructing_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "lazy.py",
        """
        CONSTRUCTED = []

        class Lazy(runmodel.Model):
            def __init__(self, device=None, init_options=None):
                super().__init__(device, init_options)
                CONSTRUCTED.append(device)

            def run(self, runstep, steps=None, *args, **kwargs):
                pass
    """,
    )
    cls = load_model_class(str(path))
    assert cls.__name__ == "Lazy"
    assert sys.modules[cls.__module__].CONSTRUCTED == []
    model = cls(device="meta")
    assert sys.modules[cls.__module__].CONSTRUCTED == ["meta"]
    assert model.init_options == {}


def test_defaults_apply_without_device_or_init_options(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "plain.py",
        """
        class Plain(runmodel.Model):
            init_defaults = {"hidden": 8}

            def run(self, runstep, steps=None, *args, **kwargs):
                pass
    """,
    )
    model = runmodel.load_model(str(path))
    assert type(model).__name__ == "Plain"
    assert model.device is None
    assert model.init_options == {"hidden": 8}


def test_a_torch_model_gets_its_module_on_the_torch_device(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "linear.py",
        """
        import torch
        from torch import nn

        class Linear(runmodel.TorchModel):
            init_defaults = {"width": 4}

            def __init__(self, device=None, init_options=None):
                super().__init__(device, init_options)
                self.module = nn.Linear(self.init_options["width"], 1)
    """,
    )
    model = runmodel.load_model(str(path), device="cpu", init_options={"width": 6})
    assert type(model).__name__ == "Linear"
    assert isinstance(model, runmodel.TorchModel)
    assert model.device == torch.device("cpu")
    assert model.module.in_features == 6
    assert next(model.module.parameters()).device == torch.device("cpu")


def test_imported_and_abstract_model_classes_do_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper = f"loader_helper_{next(_unique)}"
    write(tmp_path, f"{helper}.py", models("Imported"))
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write(
        tmp_path,
        "mixed.py",
        f"""
        import abc

        from runmodel import Model, TorchModel
        from {helper} import Imported

        class Base(runmodel.Model):
            \"\"\"Abstract: run() is not defined.\"\"\"

        class AlsoAbstract(runmodel.TorchModel):
            @abc.abstractmethod
            def build(self): ...

        class Concrete(Base):
            def run(self, runstep, steps=None, *args, **kwargs):
                pass
    """,
    )
    try:
        cls = load_model_class(str(path))
        assert cls.__name__ == "Concrete"
        module = sys.modules[cls.__module__]
        assert module.Imported.__module__ == helper
        assert module.TorchModel is runmodel.TorchModel
        loaded = type(runmodel.load_model(str(path)))
        assert loaded.__name__ == "Concrete"
        assert loaded is not cls  # each load imports the file afresh
    finally:
        sys.modules.pop(helper, None)


def test_a_loaded_model_pickles_and_its_dataclasses_work(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "configured.py",
        """
        import dataclasses

        @dataclasses.dataclass
        class Config:
            width: int = 3

        class Configured(runmodel.Model):
            def __init__(self, device=None, init_options=None):
                super().__init__(device, init_options)
                self.config = Config()

            def run(self, runstep, steps=None, *args, **kwargs):
                pass
    """,
    )
    model = runmodel.load_model(str(path), device="cpu")
    copy = pickle.loads(pickle.dumps(model))
    assert type(copy) is type(model)
    assert (copy.device, repr(copy.config)) == ("cpu", "Config(width=3)")


# -- naming the class: path/file.py:ClassName and package.module:ClassName --------------


def test_file_colon_class_picks_among_several(tmp_path: Path) -> None:
    path = write(tmp_path, "several.py", models("Alpha", "Beta", "Gamma"))
    for name in ("Alpha", "Beta", "Gamma"):
        model = runmodel.load_model(f"{path}:{name}", device="cpu")
        assert type(model).__name__ == name
        assert type(model).__module__.startswith("runmodel_source_several_")
        assert model.device == "cpu"


def test_file_colon_class_may_name_a_class_with_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "rel.py", models("One", "Two"))
    monkeypatch.chdir(tmp_path)
    assert type(runmodel.load_model("sub/rel.py:Two")).__name__ == "Two"
    assert load_model_class("sub/rel.py:One").__name__ == "One"


def test_package_module_colon_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = f"loader_pkg_{next(_unique)}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    write(
        tmp_path / package,
        "nets.py",
        """
        class Small(runmodel.Model):
            init_defaults = {"size": 1}

            def run(self, runstep, steps=None, *args, **kwargs):
                pass

        class Large(Small):
            init_defaults = {"size": 100}
    """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        model = runmodel.load_model(f"{package}.nets:Large", device="cpu", init_options={"size": 7})
        cls = type(model)
        assert (cls.__name__, cls.__module__) == ("Large", f"{package}.nets")
        assert model.init_options == {"size": 7}
        assert model.device == "cpu"
        assert load_model_class(f"{package}.nets:Small").__name__ == "Small"
        with pytest.raises(
            ValueError,
            match=r"'Medium' is not defined; Model subclasses "
            r"there: Large, Small",
        ):
            load_model_class(f"{package}.nets:Medium")
    finally:
        for key in [k for k in sys.modules if k.split(".")[0] == package]:
            del sys.modules[key]


def test_naming_an_abstract_model_class_fails_to_load_naming_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "abstract.py",
        "class Base(runmodel.Model):\n    pass\n" + models("Real", base="Base"),
    )
    with pytest.raises((TypeError, ValueError), match=r"(?i)abstract.*\bBase\b|\bBase\b.*abstract"):
        runmodel.load_model(f"{path}:Base")
    assert type(runmodel.load_model(f"{path}:Real")).__name__ == "Real"


# -- none or several -----------------------------------------------------------------------


def test_no_model_subclass_is_an_error_that_says_how_to_name_one(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "empty.py",
        """
        from runmodel import Model, TorchModel

        class Base(Model):
            pass

        class NotAModel:
            def run(self):
                pass
    """,
    )
    with pytest.raises(ValueError) as caught:
        load_model_class(str(path))
    message = str(caught.value)
    assert message.startswith(f"{str(path)!r} defines no runmodel.Model subclasses (none); ")
    assert "file.py:ClassName" in message
    with pytest.raises(ValueError, match=r"defines no runmodel\.Model subclasses"):
        runmodel.load_model(str(path))


def test_several_model_subclasses_is_an_error_listing_them(tmp_path: Path) -> None:
    path = write(tmp_path, "many.py", models("Zeta", "Alpha", "Mid"))
    with pytest.raises(ValueError) as caught:
        runmodel.load_model(str(path))
    message = str(caught.value)
    assert "defines several runmodel.Model subclasses (Alpha, Mid, Zeta)" in message
    hint = re.search(r"; name one, as '(.*):(\w+)'$", message)
    assert hint is not None, message
    assert hint[1] == str(path)
    assert hint[2] in ("Alpha", "Mid", "Zeta")


# -- the same file twice --------------------------------------------------------------------


def test_the_same_file_loads_twice_side_by_side(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "stateful.py",
        """
        LOG = []
        IMPORTS = [1]

        class Stateful(runmodel.Model):
            label = "original"

            def __init__(self, device=None, init_options=None):
                super().__init__(device, init_options)
                LOG.append(device)

            def run(self, runstep, steps=None, *args, **kwargs):
                pass
    """,
    )
    first, second = load_model_class(str(path)), load_model_class(str(path))
    assert first is not second
    assert first.__module__ != second.__module__
    one, two = sys.modules[first.__module__], sys.modules[second.__module__]
    assert one is not two
    assert one.LOG is not two.LOG
    first("a")
    first("b")
    assert (one.LOG, two.LOG) == (["a", "b"], [])
    second("c")
    assert (one.LOG, two.LOG) == (["a", "b"], ["c"])
    first.label = "changed"
    assert second.label == "original"
    assert one.IMPORTS == two.IMPORTS == [1]  # each load ran the module's code once
    # load_model also imports afresh each time
    third, fourth = runmodel.load_model(str(path)), runmodel.load_model(str(path))
    assert len({type(third), type(fourth), first, second}) == 4
    assert sys.modules[type(third).__module__].LOG == [None]
    assert sys.modules[type(fourth).__module__].LOG == [None]


# -- errors ---------------------------------------------------------------------------------


def test_a_missing_file_is_file_not_found_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "absent.py"
    with pytest.raises(FileNotFoundError) as caught:
        runmodel.load_model(str(missing))
    assert repr(str(missing)) in str(caught.value)
    with pytest.raises(FileNotFoundError, match=r"absent\.py"):
        load_model_class(f"{missing}:Model")


def test_a_directory_is_not_a_model_file(tmp_path: Path) -> None:
    (tmp_path / "folder.py").mkdir()
    with pytest.raises(FileNotFoundError, match=r"folder\.py"):
        load_model_class(str(tmp_path / "folder.py"))


def test_a_missing_module_is_module_not_found_naming_it() -> None:
    name = f"loader_no_such_module_{next(_unique)}"
    with pytest.raises(ModuleNotFoundError) as caught:
        load_model_class(f"{name}.models:Net")
    assert repr(f"{name}.models") in str(caught.value)
    assert name not in sys.modules


def test_a_class_name_that_is_not_there_lists_the_available_classes(tmp_path: Path) -> None:
    path = write(tmp_path, "two.py", models("First", "Second"))
    with pytest.raises(ValueError) as caught:
        load_model_class(f"{path}:Third")
    assert str(caught.value) == (
        f"'{path}:Third': 'Third' is not defined; Model subclasses there: First, Second"
    )


@pytest.mark.parametrize("name", ["NotAModel", "Plain", "helper", "torch"])
def test_a_name_bound_to_something_else_than_a_model_is_an_error(tmp_path: Path, name: str) -> None:
    path = write(
        tmp_path,
        "others.py",
        models("Real")
        + """
NotAModel = 42

class Plain:
    def run(self, runstep, steps=None):
        pass

def helper():
    pass

import torch
""",
    )
    with pytest.raises(ValueError) as caught:
        runmodel.load_model(f"{path}:{name}")
    assert str(caught.value) == (
        f"'{path}:{name}': '{name}' is not a runmodel.Model subclass; Model subclasses there: Real"
    )


@pytest.mark.parametrize(
    "source",
    [
        "",
        "   ",
        "some.module",
        "module",
        "file.py:",
        "file.py:1bad",
    ],
)
def test_a_malformed_source_is_a_value_error_giving_the_accepted_forms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "file.py", models("Real"))  # the file exists: the string is what's wrong
    with pytest.raises(ValueError) as caught:
        runmodel.load_model(source)
    message = str(caught.value)
    assert repr(source) in message
    assert "package.module:ClassName" in message
    assert ".py" in message


@pytest.mark.parametrize("source", ["file.py:", "file.py:1bad", "file.py:a-b", "pkg.mod:"])
def test_a_malformed_class_part_is_a_value_error_naming_it(tmp_path: Path, source: str) -> None:
    # independent of the message's wording: rejected before any file is looked at
    with pytest.raises(ValueError) as caught:
        load_model_class(str(tmp_path / source))
    class_part = source.partition(":")[2]
    assert f"{class_part!r} after ':' is not a class name" in str(caught.value)


def test_a_syntax_error_propagates_and_leaves_no_module_behind(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "broken.py",
        """
        class Broken(runmodel.Model):
            def run(self, runstep, steps=None):
                return (
    """,
    )
    before = set(sys.modules)
    with pytest.raises(SyntaxError) as caught:
        runmodel.load_model(str(path))
    assert caught.value.filename == str(path)
    assert new_source_modules(before, "broken") == []


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("raise RuntimeError('failed at import')\n", RuntimeError),
        (f"import loader_absent_dependency_{next(_unique)}\n", ModuleNotFoundError),
        ("raise KeyboardInterrupt\n", KeyboardInterrupt),
    ],
)
def test_a_failing_import_leaves_no_half_loaded_module(
    tmp_path: Path, body: str, error: type[BaseException]
) -> None:
    path = write(tmp_path, "halfway.py", models("Halfway") + body)
    before = set(sys.modules)
    with pytest.raises(error):
        load_model_class(str(path))
    assert new_source_modules(before, "halfway") == []
    # and the next load of a fixed file works
    path.write_text(HEADER + models("Halfway"))
    assert load_model_class(str(path)).__name__ == "Halfway"
    assert len(new_source_modules(before, "halfway")) == 1


# -- init options ------------------------------------------------------------------------

HIDDEN = """
    class Hidden(runmodel.Model):
        init_defaults = {"hidden": 8}

        def run(self, runstep, steps=None, *args, **kwargs):
            pass
"""


def test_init_options_override_defaults_and_unknown_keys_warn_once(tmp_path: Path) -> None:
    path = write(tmp_path, "hidden.py", HIDDEN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = runmodel.load_model(str(path), init_options={"hidden": 16, "bogus": 1})
    assert model.init_options == {"hidden": 16}
    assert [w.category for w in caught] == [UserWarning]
    message = str(caught[0].message)
    assert "'bogus'" in message
    assert "unknown init option" in message
    assert "hidden" in message  # what is known


def test_an_init_option_of_the_wrong_type_is_a_type_error(tmp_path: Path) -> None:
    path = write(tmp_path, "hidden.py", HIDDEN)
    with pytest.raises(TypeError) as caught:
        runmodel.load_model(str(path), init_options={"hidden": "big"})
    message = str(caught.value)
    assert "'hidden'" in message
    assert "must be int" in message
    assert "'big'" in message
