"""The ``Interface`` strategies on real torch models: ``Supervised``'s train step,
inference, evaluation and saving, and a custom interface in each mode."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import runmodel

from helpers import Tiny, make_data, params


def classifier(device: str = "cpu") -> Tiny:
    """A 4 -> 3 linear classifier, SGD(lr=0.1), on 3 batches of 8 (and 3 others to
    evaluate)."""
    return Tiny(device, classes=3, batches=3)


def batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """3 batches of 8 for ``classifier()``, on the CPU."""
    return make_data(3, classes=3, seed=seed)


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("train_step", (None, None)),
        ("evaluate", (None, [])),
        ("inference", (None, None)),
        ("generate", (None, None)),
        ("save", (None, ".")),
    ],
)
def test_interface_methods_say_they_are_missing(method: str, args: tuple[Any, ...]) -> None:
    class Mine(runmodel.Interface):
        pass

    with pytest.raises(NotImplementedError, match=f"^Mine has no {method}$"):
        getattr(Mine(), method)(*args)
    with pytest.raises(NotImplementedError, match=f"^Interface has no {method}$"):
        getattr(runmodel.Interface(), method)(*args)


def test_supervised_train_step_is_a_real_step(device: str) -> None:
    model = classifier(device)
    model.setup()
    reference = copy.deepcopy(model.module)
    x, y = (t.to(device) for t in model.train_data[0])
    expected_output = reference(x)
    expected_loss = nn.functional.cross_entropy(expected_output, y)
    expected_loss.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    before = params(model)

    result = runmodel.Supervised().train_step(model, (x, y))

    assert set(result) == {"loss", "output"}
    assert torch.equal(result["loss"], expected_loss.detach())
    assert torch.equal(result["output"], expected_output.detach())
    assert not result["loss"].requires_grad and not result["output"].requires_grad
    assert not torch.equal(params(model), before)
    assert torch.allclose(params(model), params(reference), atol=1e-7)
    assert all(p.grad is None for p in model.module.parameters())  # zeroed for the next


def test_supervised_inference_has_no_grad(device: str) -> None:
    model = classifier(device)
    x = batches()[0][0].to(device)
    output = runmodel.Supervised().inference(model, (x, None))
    assert not output.requires_grad
    assert torch.is_grad_enabled()
    with torch.no_grad():
        assert torch.equal(output, model.module(x))


def test_supervised_evaluate_matches_runmodel_evaluate(device: str) -> None:
    model = classifier(device)
    model.setup()
    data = batches(seed=3)  # on the CPU: evaluate() moves each batch to the model's device
    metrics = runmodel.Supervised().evaluate(model, data)
    assert set(metrics) == {"loss", "accuracy"}
    assert metrics == runmodel.evaluate(model, data)
    with torch.no_grad():
        x = torch.cat([b[0] for b in data]).to(device)
        y = torch.cat([b[1] for b in data]).to(device)
        logits = model.module(x)
    assert metrics["accuracy"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    assert metrics["loss"] == pytest.approx(nn.functional.cross_entropy(logits, y).item())


def test_supervised_save_writes_loadable_weights(tmp_path: Path, device: str) -> None:
    model = classifier(device)
    path = runmodel.Supervised().save(model, tmp_path / "out")
    assert path == tmp_path / "out" / "model.pt" and path.is_file()
    fresh = nn.Linear(4, 3)  # on the CPU, whatever device saved them
    fresh.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    assert torch.equal(params(fresh), params(model).cpu())
    x = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(fresh(x), copy.deepcopy(model.module).cpu()(x))


class Recording(runmodel.Interface):
    """Records what it is called with; its loss is the step number as a tensor."""

    def __init__(self) -> None:
        self.trained: list[Any] = []
        self.inferred: list[Any] = []
        self.losses: list[torch.Tensor] = []

    def train_step(self, model: Any, batch: Any) -> dict[str, Any]:
        self.trained.append(batch)
        loss = torch.tensor(float(len(self.trained)))
        self.losses.append(loss)
        return {"loss": loss, "extra": len(self.trained)}

    def inference(self, model: Any, batch: Any) -> Any:
        self.inferred.append(batch)
        with torch.no_grad():
            return -model.module(batch[0])


def test_a_custom_interface_runs_train_steps(engine: runmodel.Engine) -> None:
    model = classifier()
    model.interface = interface = Recording()
    fired: list[str] = []
    for phase in ("forward", "backward", "optimizer_step"):
        engine.on(phase, lambda e, phase=phase: fired.append(phase))
    seen: list[Any] = []
    engine.on("runstep", lambda e: seen.append((e.state.loss, e.state.output)))
    before = params(model.module)

    result = engine.run(model, epochs=2)

    data = model.train_data
    assert result.steps == 6 and result.epochs == 2
    assert len(interface.trained) == 6
    assert all(got is want for got, want in zip(interface.trained, data + data, strict=True))
    assert all(a is b for (a, _), b in zip(seen, interface.losses, strict=True))
    assert [output["extra"] for _, output in seen] == [1, 2, 3, 4, 5, 6]
    assert fired == []
    assert torch.equal(params(model.module), before)  # its train_step trains nothing
    assert interface.inferred == []


def test_a_custom_interface_runs_infer_steps(engine: runmodel.Engine) -> None:
    model = classifier()
    model.interface = interface = Recording()
    result = engine.run(model, mode="infer")
    data = model.eval_data
    assert len(interface.inferred) == len(data) == result.steps
    assert all(got is want for got, want in zip(interface.inferred, data, strict=True))
    assert result.outputs is not None and len(result.outputs) == len(data)
    with torch.no_grad():
        for output, (x, _) in zip(result.outputs, data, strict=True):
            assert torch.equal(output, -model.module(x))
    assert interface.trained == []


def test_a_custom_interface_runs_eval_steps(engine: runmodel.Engine) -> None:
    model = classifier()
    model.interface = interface = Recording()
    result = engine.run(model, mode="eval")
    data = model.eval_data
    assert all(got is want for got, want in zip(interface.inferred, data, strict=True))
    assert len(interface.inferred) == len(data)
    with torch.no_grad():
        x = torch.cat([b[0] for b in data])
        y = torch.cat([b[1] for b in data])
        negated = -model.module(x)
    assert result.metrics["accuracy"] == pytest.approx(
        (negated.argmax(1) == y).float().mean().item()
    )
    assert result.metrics["loss"] == pytest.approx(
        nn.functional.cross_entropy(negated, y).item(), rel=1e-5
    )
    assert interface.trained == []


def test_the_default_interface_still_uses_the_phases(engine: runmodel.Engine) -> None:
    model = classifier()
    fired: list[str] = []
    for phase in ("forward", "backward", "optimizer_step"):
        engine.on(phase, lambda e, phase=phase: fired.append(phase))
    engine.run(model, steps=2)
    assert fired == ["forward", "backward", "optimizer_step"] * 2
