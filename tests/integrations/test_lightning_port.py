"""Lightning's own fine-tuning example (``computer_vision_fine_tuning.py``: a
``LightningModule`` with a torchmetrics accuracy, ``MultiStepLR``, and the two-stage
``MilestonesFinetuning`` callback over ``BaseFinetuning``), shrunk to a CPU: a tiny
backbone shaped like ResNet's children, scikit-learn's digits as two classes, a random
horizontal flip. Run by a real ``lightning.pytorch.Trainer`` and ported to runmodel with
``Evaluate`` (``loss_reduction="float32"``, Lightning's ``self.log`` average),
``LRSchedule`` over ``MultiStepLR`` and ``Unfreeze`` at the milestones; one hook of the
port's own keeps BatchNorm's running statistics as ``BaseFinetuning.freeze`` does.
Every logged epoch value, every trained parameter's learning rate at every epoch and
the final weights are bit for bit the same (docs/migrating_lightning.md)."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import MultiStepLR
from torch.utils.data import DataLoader, Dataset

import runmodel
from runmodel.models.loss_metric import DoubleLoss
from runmodel.packs import Evaluate, LRSchedule, Unfreeze

L = pytest.importorskip("lightning")
pytest.importorskip("torchmetrics")
pytest.importorskip("sklearn")

EPOCHS, MILESTONES, SEED = 15, (5, 10), 1234
LR, GAMMA, BATCH = 1e-2, 0.1, 32

Record = dict[str, Any]  # what a program leaves: values per epoch, lrs per epoch, weights


class Digits(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """scikit-learn's digits as 1x8x8 images, two classes (below 5, 5 and up); training
    images flipped as ``transforms.RandomHorizontalFlip`` does (a draw per image)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, flip: bool) -> None:
        self.images, self.labels, self.flip = images, labels, flip

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[i]
        if self.flip and torch.rand(1) < 0.5:
            image = image.flip(-1)
        return image, self.labels[i]


def loaders() -> tuple[DataLoader[Any], DataLoader[Any]]:
    """The example's loaders: training shuffled (by torch's global generator), validation
    in order; 400 and 200 images in batches of 32, each split's last batch smaller."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x[:600], dtype=torch.float32).view(-1, 1, 8, 8) / 16
    labels = torch.tensor(y[:600] >= 5).long()
    train = Digits(images[:400], labels[:400], flip=True)
    val = Digits(images[400:], labels[400:], flip=False)
    return DataLoader(train, batch_size=BATCH, shuffle=True), DataLoader(val, batch_size=BATCH)


def block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()
    )


def feature_extractor() -> nn.Sequential:
    """ResNet's children but its ``fc`` (``list(backbone.children())[:-1]``), tiny: conv1,
    bn1, relu, maxpool, layer1-4, avgpool. No pretrained weights: made from the seed."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        block(8, 8),
        block(8, 16),
        block(16, 16),
        block(16, 16),
        nn.AdaptiveAvgPool2d(1),
    )


def classifier() -> nn.Sequential:
    """The example's ``fc`` (2048-256-32-1), tiny."""
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8), nn.Linear(8, 1))


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The example's loss: ``F.binary_cross_entropy_with_logits`` on ``y`` as a column."""
    return F.binary_cross_entropy_with_logits(logits, y.view((-1, 1)).type_as(logits))


def batch_accuracy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """What ``self.valid_acc(y_scores, y_true.int())`` returns for one batch."""
    from torchmetrics.functional.classification import binary_accuracy

    return binary_accuracy(torch.sigmoid(logits), y.view((-1, 1)).int())


def learning_rates(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, float]:
    """Each parameter the optimizer trains now, by name: the lr of its group."""
    return {
        names[id(p)]: group["lr"]
        for group in optimizer.param_groups
        for p in group["params"]
        if p.requires_grad
    }


def seed_everything(seed: int) -> None:
    """What ``lightning.seed_everything`` seeds: Python's, NumPy's and torch's generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def process_settings_kept() -> Iterator[None]:
    """One thread for torch (two OpenMP threads over tensors this small cost many times
    what they save on a shared machine), and, after, what ``Trainer(deterministic=True)``
    and ``seed_everything`` set process-wide put back for the other tests."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    environ = dict(os.environ)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark
        os.environ.clear()
        os.environ.update(environ)


def lightning_program(root: Path) -> Record:
    """The example as Lightning runs it: its callback and module as written there (the
    backbone and data shrunk), fitted by a ``Trainer`` on the CPU with the CLI's
    defaults (15 epochs, no sanity check, seed 1234)."""
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.callbacks.finetuning import BaseFinetuning
    from torchmetrics import Accuracy

    class MilestonesFinetuning(BaseFinetuning):
        def __init__(self, milestones: tuple[int, int] = (5, 10), train_bn: bool = False):
            super().__init__()
            self.milestones = milestones
            self.train_bn = train_bn

        def freeze_before_training(self, pl_module: Any) -> None:
            self.freeze(modules=pl_module.feature_extractor, train_bn=self.train_bn)

        def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
            if epoch == self.milestones[0]:  # unfreeze 5 last layers
                self.unfreeze_and_add_param_group(
                    modules=pl_module.feature_extractor[-5:],
                    optimizer=optimizer,
                    train_bn=self.train_bn,
                )
            elif epoch == self.milestones[1]:  # unfreeze remaining layers
                self.unfreeze_and_add_param_group(
                    modules=pl_module.feature_extractor[:-5],
                    optimizer=optimizer,
                    train_bn=self.train_bn,
                )

    class TransferLearningModel(L.LightningModule):
        def __init__(self, milestones: tuple[int, int] = MILESTONES) -> None:
            super().__init__()
            self.milestones, self.lr, self.lr_scheduler_gamma = milestones, LR, GAMMA
            self.feature_extractor = feature_extractor()
            self.fc = classifier()
            self.loss_func = F.binary_cross_entropy_with_logits
            self.train_acc = Accuracy(task="binary")
            self.valid_acc = Accuracy(task="binary")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.feature_extractor(x)
            x = x.squeeze(-1).squeeze(-1)
            return self.fc(x)

        def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return self.loss_func(input=logits, target=labels)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            y_logits = self.forward(x)
            y_scores = torch.sigmoid(y_logits)
            y_true = y.view((-1, 1)).type_as(x)
            train_loss = self.loss(y_logits, y_true)
            self.log("train_acc", self.train_acc(y_scores, y_true.int()), prog_bar=True)
            return train_loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            y_logits = self.forward(x)
            y_scores = torch.sigmoid(y_logits)
            y_true = y.view((-1, 1)).type_as(x)
            self.log("val_loss", self.loss(y_logits, y_true), prog_bar=True)
            self.log("val_acc", self.valid_acc(y_scores, y_true.int()), prog_bar=True)

        def configure_optimizers(self) -> Any:
            parameters = list(self.parameters())
            trainable_parameters = list(filter(lambda p: p.requires_grad, parameters))
            optimizer = torch.optim.Adam(trainable_parameters, lr=self.lr)
            scheduler = MultiStepLR(
                optimizer, milestones=self.milestones, gamma=self.lr_scheduler_gamma
            )
            return [optimizer], [scheduler]

    record: Record = {"values": [], "lrs": []}

    class Recorder(Callback):  # after the fine-tuning callback: the epoch's own lrs
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            names = {id(p): n for n, p in pl_module.named_parameters()}
            record["lrs"].append(learning_rates(trainer.optimizers[0], names))

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            logged = trainer.callback_metrics
            record["values"].append({k: float(logged[k]) for k in ("val_loss", "val_acc")})

    L.seed_everything(SEED)
    model = TransferLearningModel()
    train_loader, val_loader = loaders()
    trainer = L.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=1,
        deterministic=True,
        num_sanity_val_steps=0,
        callbacks=[MilestonesFinetuning(MILESTONES), Recorder()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(model, train_loader, val_loader)
    record["weights"] = model.state_dict()
    return record


class TransferNet(nn.Module):
    """The example's network without Lightning: the feature extractor, then ``fc``."""

    def __init__(self) -> None:
        super().__init__()
        self.feature_extractor = feature_extractor()
        self.fc = classifier()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.feature_extractor(x).squeeze(-1).squeeze(-1))


def trained_names(children: nn.Module) -> list[str]:
    """The parameters ``BaseFinetuning.unfreeze_and_add_param_group(children,
    train_bn=False)`` adds, as names of ``children`` (BatchNorm's weight and bias stay
    frozen)."""
    return [
        f"{name}.{p}"
        for name, module in children.named_modules()
        if not isinstance(module, nn.modules.batchnorm._BatchNorm)
        for p, _ in module.named_parameters(recurse=False)
    ]


def runmodel_program() -> Record:
    """The port: the network and data as they were, the optimizer over all parameters,
    the callback's stages an ``Unfreeze``, the scheduler an ``LRSchedule``, the logged
    values an ``Evaluate``."""
    seed_everything(SEED)
    network = TransferNet()
    train_loader, val_loader = loaders()
    model = runmodel.TorchModel.from_parts(
        network,
        optimizer=lambda params: torch.optim.Adam(params, lr=LR),
        loss_fn=loss_fn,
        train_data=train_loader,
        eval_data=val_loader,
        device="cpu",
    )
    extractor = network.feature_extractor
    first, last = MILESTONES
    stages = {
        0: ["fc"],
        first: [f"feature_extractor.{n}" for n in trained_names(extractor[-5:])],
        last: [f"feature_extractor.{n}" for n in trained_names(extractor[:-5])],
    }
    engine = runmodel.Engine(
        # a group added at a milestone at group 0's lr / 10: here from the start at lr / 10,
        # decayed by the milestones before it as Lightning's group 0 was
        Unfreeze(stages, lr_scale={first: 0.1, last: 0.1}),
        LRSchedule(
            lambda optimizer: MultiStepLR(optimizer, milestones=MILESTONES, gamma=GAMMA),
            interval="epoch",
        ),
        Evaluate(
            prefix="val_",
            metrics={"loss": DoubleLoss(loss_fn), "acc": DoubleLoss(batch_accuracy)},
            loss_reduction="float32",
        ),
    )

    @engine.on("epoch_start", priority=90)  # after Unfreeze's (100), before any step
    def running_statistics(engine: runmodel.Engine) -> None:
        """``BaseFinetuning.freeze`` stops a BatchNorm's running statistics
        (``track_running_stats=False``); unfreezing its children starts them again."""
        for stage, children in ((first, extractor[-5:]), (last, extractor[:-5])):
            for module in children.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.track_running_stats = engine.state.epoch >= stage

    record: Record = {"values": [], "lrs": []}
    names = {id(p): n for n, p in network.named_parameters()}

    @engine.on("epoch_start")
    def epoch_lrs(engine: runmodel.Engine) -> None:
        record["lrs"].append(learning_rates(model.optimizer, names))

    @engine.on("epoch_end", after="evaluate")
    def epoch_values(engine: runmodel.Engine) -> None:
        record["values"].append({k: engine.state.metrics[k] for k in ("val_loss", "val_acc")})

    engine.run(model, epochs=EPOCHS)
    record["weights"] = network.state_dict()
    return record


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Record, Record]:
    with process_settings_kept():
        return lightning_program(tmp_path_factory.mktemp("lightning")), runmodel_program()


def test_every_logged_epoch_value_is_lightnings(programs: tuple[Record, Record]) -> None:
    theirs, ours = programs
    assert len(ours["values"]) == EPOCHS
    assert ours["values"] == theirs["values"]


def test_each_trained_parameter_has_lightnings_lr_every_epoch(
    programs: tuple[Record, Record],
) -> None:
    theirs, ours = programs
    assert ours["lrs"] == theirs["lrs"]
    trained = [len(lrs) for lrs in ours["lrs"]]
    assert trained[0] < trained[MILESTONES[0]] < trained[MILESTONES[1]]


def test_the_final_weights_are_lightnings(programs: tuple[Record, Record]) -> None:
    theirs, ours = programs
    assert ours["weights"].keys() == theirs["weights"].keys()
    for name, weight in theirs["weights"].items():
        assert torch.equal(ours["weights"][name], weight), name
