"""Backends: plain, a configured optimizer, the fine-tune spec, custom backends, amp
(bfloat16 autocast on the CPU; float16 and a GradScaler on CUDA) and compile (the eager
backend), by object and by name."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.backends import AMP, Backend, Compile, Plain, RunHorizon
from runmodel.config.registry import Spec, optimizer_factory
from runmodel.packs import Checkpoint

from helpers import Tiny, assert_equal_params, make_data, plain_sgd


def tiny(device: str = "cpu", data: Any = None) -> Tiny:
    """A linear regression on 4 batches of 8; its own optimizer is Adam(lr=0.05)."""
    return Tiny(device, optimizer=torch.optim.Adam, lr=0.05, data=data)


# -- plain and a configured optimizer -------------------------------------------------------


@pytest.mark.parametrize(
    "backend", [None, "plain", Plain(), Spec("plain")], ids=["default", "name", "object", "spec"]
)
def test_plain_changes_nothing(backend: Any, device: str) -> None:
    reference = tiny(device)
    runmodel.Engine().run(reference, epochs=2)
    model, optimizers = tiny(device), []
    engine = runmodel.Engine()
    engine.on("setup", lambda e: optimizers.append(e.model.optimizer))
    engine.on("runstep", lambda e: optimizers.append(e.model.optimizer))
    engine.run(model, epochs=2, backend=backend)
    assert type(model.module) is nn.Linear
    assert all(o is model.optimizer for o in optimizers) and len(optimizers) == 9
    assert isinstance(model.optimizer, torch.optim.Adam)
    assert_equal_params(model, reference)


def check_sgd_replaces_adam(backend: Backend, device: str) -> None:
    model, seen = tiny(device), []
    engine = runmodel.Engine()
    engine.on(
        "setup",
        lambda e: seen.append(
            ("setup", type(e.model.optimizer).__name__, e.model.optimizer.param_groups[0]["lr"])
        ),
    )
    engine.on("step_start", lambda e: seen.append(("step", id(e.model.optimizer))))
    engine.run(model, epochs=2, backend=backend)
    assert isinstance(model.optimizer, torch.optim.SGD)
    assert model.optimizer.param_groups[0]["lr"] == 0.1
    assert seen[0] == ("setup", "SGD", 0.1)
    assert seen[1:] == [("step", id(model.optimizer))] * 8
    # the replacement steps the module's own parameters: a plain SGD loop, exactly
    assert_equal_params(model, plain_sgd(tiny(device).module, make_data(), lr=0.1, epochs=2))


@pytest.mark.parametrize(
    "spec", [Spec("sgd", {"lr": 0.1}), {"type": "sgd", "args": {"lr": 0.1}}], ids=["Spec", "dict"]
)
def test_an_optimizer_spec_replaces_the_models_optimizer(spec: Any, device: str) -> None:
    check_sgd_replaces_adam(
        runmodel.make_backend({"type": "plain", "args": {"optimizer": spec}}), device
    )


def test_an_optimizer_factory_replaces_the_models_optimizer(device: str) -> None:
    check_sgd_replaces_adam(Plain(optimizer=functools.partial(torch.optim.SGD, lr=0.1)), device)


def test_an_optimizer_set_on_the_backend_replaces_the_models_optimizer(device: str) -> None:
    backend = runmodel.make_backend("plain")
    backend.optimizer = optimizer_factory(Spec("sgd", {"lr": 0.1}))
    check_sgd_replaces_adam(backend, device)


def test_an_optimizer_that_is_no_factory_is_refused() -> None:
    with pytest.raises(
        TypeError,
        match=r"optimizer= takes a factory .* got 'sgd'; a config "
        r"names optimizers",
    ):
        Plain(optimizer="sgd")  # type: ignore[arg-type]


def test_a_backends_optimizer_needs_a_module() -> None:
    class NoModule(runmodel.Model):
        def run(
            self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
        ) -> None:
            runstep(0)

    with pytest.raises(ValueError, match=r"an optimizer for the backend needs NoModule\.module"):
        runmodel.Engine().run(NoModule(), backend=Plain(optimizer=torch.optim.SGD))


def test_an_unknown_optimizer_is_a_key_error_when_the_backend_is_made() -> None:
    with pytest.raises(
        KeyError,
        match=r"no optimizer registered as 'sdg'\. Did you mean "
        r"'sgd'\?",
    ):
        runmodel.make_backend({"type": "plain", "args": {"optimizer": "sdg"}})


# -- the fine-tune spec ----------------------------------------------------------------------


def generator() -> Iterator[int]:
    yield from range(3)


@pytest.mark.parametrize(
    ("data", "steps", "epochs", "expected"),
    [
        ([1, 2, 3, 4], None, 3, RunHorizon(3, 12, 4, None)),
        ([1, 2, 3, 4], 5, 3, RunHorizon(3, 5, 4, None)),
        ([1, 2, 3, 4], 7, None, RunHorizon(None, 7, 4, None)),
        ([1, 2, 3, 4], None, None, RunHorizon(None, None, 4, None)),
        (
            DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=3),
            None,
            2,
            RunHorizon(2, 8, 4, 3),
        ),
        (
            DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=3, drop_last=True),
            None,
            2,
            RunHorizon(2, 6, 3, 3),
        ),
        (generator(), None, 2, RunHorizon(2, None, None, None)),
        (generator(), 6, 2, RunHorizon(2, 6, None, None)),
        (None, None, 1, RunHorizon(1, None, None, None)),
    ],
    ids=[
        "list-epochs",
        "list-steps-win",
        "list-steps",
        "list-nothing",
        "loader",
        "loader-drop-last",
        "generator",
        "generator-steps",
        "none",
    ],
)
def test_fine_tune_spec_of(
    data: Any, steps: int | None, epochs: int | None, expected: RunHorizon
) -> None:
    assert RunHorizon.of(data, steps, epochs) == expected


class Recording(Backend):
    """Records the spec it is given and when, and brings a pack of its own."""

    def __init__(self, log: list[str], **options: Any) -> None:
        super().__init__(**options)
        self.log = log
        self.specs: list[RunHorizon] = []
        self.had_optimizer: list[bool] = []

    def initialize(self, model: Any, spec: RunHorizon) -> None:
        self.log.append("backend.initialize")
        self.specs.append(spec)
        self.had_optimizer.append(getattr(model, "optimizer", None) is not None)
        super().initialize(model, spec)

    def pack(self) -> runmodel.Pack:
        log = self.log

        class Counter(runmodel.Pack):
            name = "recording"

            def epoch_end(self, engine: runmodel.Engine) -> None:
                log.append("backend pack epoch_end")

        return Counter()


def loader_model() -> Tiny:
    x, y = torch.cat([b[0] for b in make_data()]), torch.cat([b[1] for b in make_data()])
    return tiny(data=DataLoader(TensorDataset(x, y), batch_size=16))


@pytest.mark.parametrize(
    ("steps", "epochs", "expected"),
    [
        (None, 3, RunHorizon(3, 6, 2, 16)),
        (3, None, RunHorizon(None, 3, 2, 16)),
        (5, 2, RunHorizon(2, 5, 2, 16)),
    ],
)
def test_a_custom_backend_gets_the_spec_after_model_setup(
    steps: int | None, epochs: int | None, expected: RunHorizon
) -> None:
    model = loader_model()
    log = model.calls
    backend = Recording(log)
    engine = runmodel.Engine()
    engine.on("setup", lambda e: log.append("setup hook"))
    engine.on("step_start", lambda e: log.append("step"), once=True)
    ends: list[int] = []
    engine.on("epoch_end", lambda e: ends.append(e.state.epoch))
    engine.run(model, steps=steps, epochs=epochs, backend=backend)
    assert backend.specs == [expected]
    assert backend.had_optimizer == [True]
    assert log[:4] == ["model.setup", "backend.initialize", "setup hook", "step"]
    assert log.count("backend pack epoch_end") == len(ends) > 0
    assert "recording" not in engine.describe()  # its pack is gone after the run


def test_a_backend_in_eval_mode_gets_the_eval_datas_spec() -> None:
    class Eval(Tiny):
        def setup(self, setup_options: dict[str, Any] | None = None) -> None:
            super().setup(setup_options)
            self.eval_data = DataLoader(
                TensorDataset(torch.zeros(20, 4), torch.zeros(20, 1)), batch_size=8
            )

    backend = Recording([])
    runmodel.Engine().run(Eval(), mode="eval", backend=backend)
    assert backend.specs == [RunHorizon(None, None, 3, 8)]


def test_backend_by_name_and_unknown_names() -> None:
    model = tiny()
    result = runmodel.Engine().run(model, epochs=1, backend="plain")
    assert result.steps == 4
    with pytest.raises(
        KeyError,
        match=r"no backend registered as 'plian'\. Did you mean "
        r"'plain'\?",
    ):
        runmodel.Engine().run(tiny(), epochs=1, backend="plian")
    with pytest.raises(KeyError, match=r"Registered: amp, compile, ddp, fsdp, plain"):
        runmodel.Engine().run(tiny(), epochs=1, backend="tpu")


def test_a_registered_custom_backend_by_name() -> None:
    name = f"recording-{uuid.uuid4().hex[:8]}"
    made: list[Recording] = []

    def factory(**options: Any) -> Recording:
        made.append(Recording([], **options))
        return made[-1]

    runmodel.register_backend(name, factory)
    runmodel.Engine().run(tiny(), epochs=2, backend=name)
    [backend] = made
    assert backend.specs == [RunHorizon(2, 8, 4, None)]


# -- amp -------------------------------------------------------------------------------------

#: AMP's default dtype on each device
AMP_DTYPE = {"cpu": torch.bfloat16, "cuda": torch.float16}


def test_amp_autocasts_forward(device: str) -> None:
    model, seen, losses, tables = tiny(device), [], [], []
    engine = runmodel.Engine()
    engine.on("forward", lambda e: seen.append((e.state.output.dtype, e.state.loss.dtype)))
    engine.on("epoch_end", lambda e: losses.append(e.state.loss.item()))
    engine.on("setup", lambda e: tables.append(e.describe()))
    engine.run(model, epochs=10, backend=AMP())
    assert seen == [(AMP_DTYPE[device], torch.float32)] * 40
    assert all(p.dtype == torch.float32 for p in model.module.parameters())
    assert losses[-1] < losses[0] / 4 and losses == sorted(losses, reverse=True)
    # the backend's pack is attached for the run only; float16 scales the loss (on CUDA)
    [table] = tables
    assert "override amp.autocast_forward" in table
    assert ("override amp.scaled_backward" in table) == (device == "cuda")
    assert "autocast" not in engine.describe()


def test_amp_by_name_and_a_plain_run_differ(device: str) -> None:
    amp, plain, outputs = tiny(device), tiny(device), []
    engine = runmodel.Engine()
    engine.on("forward", lambda e: outputs.append(e.state.output.dtype), once=True)
    # float16 on CUDA: the GradScaler skips a step whose gradients overflowed (the scale
    # starts at 2**16) and halves its scale; the plain run skips the same steps
    skipped: list[int] = []
    if device == "cuda":
        scales: list[float] = []
        engine.on("step_start", lambda e: scales.append(e.state.grad_scaler.get_scale()))
        engine.on(
            "runstep",
            lambda e: skipped.append(e.state.step),
            when=lambda e: e.state.grad_scaler.get_scale() < scales[-1],
        )
    engine.run(amp, epochs=1, backend="amp")
    reference = runmodel.Engine()

    @reference.override("optimizer_step")
    def same_steps(engine: runmodel.Engine, default: Any) -> None:
        if engine.state.step in skipped:
            engine.model.optimizer.zero_grad(set_to_none=True)
        else:
            default(engine)

    reference.run(plain, epochs=1)
    assert outputs == [AMP_DTYPE[device]] and len(skipped) < 4
    assert not torch.equal(amp.module.weight, plain.module.weight)
    assert torch.allclose(amp.module.weight, plain.module.weight, atol=0.05)


def test_amp_float16_scales_the_loss_on_cuda_only_and_checkpoints_the_scaler(
    device: str, tmp_path: Path
) -> None:
    seen: list[Any] = []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path))
    engine.on("forward", lambda e: seen.append(e.state.output.dtype), once=True)
    engine.on("setup", lambda e: seen.append("scaled_backward" in e.describe()))
    engine.run(tiny(device), epochs=1, backend=AMP(dtype="float16"))
    assert seen == [device == "cuda", torch.float16]  # on the CPU: autocast, no scaler
    saved = torch.load(tmp_path / "ckpt-00001-0000000004.pt", weights_only=True)
    amp = saved["engine"]["packs"]["amp"]
    if device == "cuda":
        assert sorted(amp) == ["scaler"] and amp["scaler"]["scale"] > 0
    else:
        assert amp == {}
    # a resumed run's scaler starts from the saved state
    restored: list[dict[str, Any]] = []
    resumed = runmodel.Engine()
    resumed.attach(Checkpoint(tmp_path / "resumed"))
    resumed.on(
        "step_start", lambda e: restored.append(e.state_dict()["packs"]["amp"]), once=4
    )  # the first step after the checkpoint
    result = resumed.run(tiny(device), epochs=2, resume=tmp_path, backend=AMP(dtype="float16"))
    assert result.steps == 8 and restored == [amp]


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: float16 AMP scales the loss on CUDA only"
)
def test_a_cpu_amp_checkpoint_resumes_with_a_fresh_scaler_on_cuda(tmp_path: Path) -> None:
    engine = runmodel.Engine()
    engine.attach(Checkpoint(tmp_path / "cpu"))
    engine.run(tiny("cpu"), epochs=1, backend=AMP(dtype="float16"))
    resumed = runmodel.Engine()
    resumed.attach(Checkpoint(tmp_path / "cuda"))
    result = resumed.run(
        tiny("cuda"), epochs=2, resume=tmp_path / "cpu", backend=AMP(dtype="float16")
    )
    assert result.steps == 8


@pytest.mark.parametrize("dtype", ["int8", "float32", "bf16"])
def test_amp_rejects_other_dtypes(dtype: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"AMP dtype must be 'bfloat16' or 'float16', got "
        rf"'{dtype}'",
    ):
        AMP(dtype=dtype)


def test_amp_pack_is_detached_after_a_failed_run() -> None:
    engine = runmodel.Engine()

    def boom(engine: runmodel.Engine) -> None:
        raise RuntimeError("boom")

    handle = engine.on("runstep", boom, once=1)  # at step 1
    with pytest.raises(RuntimeError, match="boom"):
        engine.run(tiny(), epochs=1, backend="amp")
    assert "autocast" not in engine.describe()
    handle.detach()
    engine.run(tiny(), epochs=1, backend="amp")  # attaches again without a name clash


# -- compile ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One compiled (eager) training run with a Checkpoint pack: 2 epochs."""
    directory = tmp_path_factory.mktemp("compiled")
    model, types = tiny(), []
    engine = runmodel.Engine()
    engine.attach(Checkpoint(directory / "checkpoint"))
    engine.on("setup", lambda e: types.append(type(e.model.module)))
    result = engine.run(model, epochs=2, backend=Compile(backend="eager"))
    return {"model": model, "types": types, "result": result, "directory": directory}


def test_compile_wraps_the_module_and_trains_like_plain(compiled: dict[str, Any]) -> None:
    from torch._dynamo.eval_frame import OptimizedModule

    assert compiled["types"] == [OptimizedModule]
    model = compiled["model"]
    assert isinstance(model.module, OptimizedModule)
    assert type(model.module._orig_mod) is nn.Linear
    assert compiled["result"].steps == 8
    plain = tiny()
    runmodel.Engine().run(plain, epochs=2)
    assert_equal_params(model.module._orig_mod, plain)


def test_a_compiled_runs_checkpoint_resumes_into_a_plain_model(compiled: dict[str, Any]) -> None:
    checkpoint = compiled["directory"] / "checkpoint" / "ckpt-00002-0000000008.pt"
    state = torch.load(checkpoint, weights_only=True)
    assert sorted(state["model"]["module"]) == ["bias", "weight"]
    plain, straight = tiny(), tiny()
    engine = runmodel.Engine()
    engine.attach(Checkpoint(compiled["directory"] / "plain"))
    result = engine.run(plain, epochs=4, resume=checkpoint)
    runmodel.Engine().run(straight, epochs=4)
    assert type(plain.module) is nn.Linear and result.steps == 16
    assert_equal_params(plain, straight)


def test_a_compiled_models_saved_weights_load_into_a_plain_module(
    compiled: dict[str, Any], tmp_path: Path
) -> None:
    path = runmodel.Supervised().save(compiled["model"], tmp_path)
    state = torch.load(path, weights_only=True)
    assert sorted(state) == ["bias", "weight"]
    nn.Linear(4, 1).load_state_dict(state)


def test_compile_needs_a_module() -> None:
    class NoModule(runmodel.Model):
        def run(
            self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any, **kwargs: Any
        ) -> None:
            runstep(0)

    with pytest.raises(ValueError, match=r"the compile backend needs NoModule\.module"):
        runmodel.Engine().run(NoModule(), backend=Compile(backend="eager"))


# -- regressions found in review ------------------------------------------------------------


def test_the_backend_pack_is_detached_even_when_a_teardown_hook_raises() -> None:
    engine = runmodel.Engine()
    failing = engine.on("teardown", lambda e: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        engine.run(tiny(), epochs=1, backend="amp")
    assert "amp" not in engine.describe()
    failing.detach()
    seen: list[int] = []
    engine.on("setup", lambda e: seen.append(e.describe().count("override amp.autocast")))
    engine.run(tiny(), epochs=1, backend="amp")
    assert seen == [1]  # one autocast override, not two


def test_compile_backend_twice_on_one_model() -> None:
    model = tiny()
    for _ in range(2):
        runmodel.Engine().run(model, epochs=1, backend=Compile(backend="eager"))
        assert type(model.module).__name__ == "OptimizedModule"
        assert isinstance(model.module._orig_mod, nn.Linear)  # not compiled twice over
