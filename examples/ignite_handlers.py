"""pytorch-ignite's handlers on a runmodel run, through ``engine.ignite``: ignite's
``EarlyStopping`` and ``ModelCheckpoint`` driven by an evaluator, and ignite metrics
(``RunningAverage`` of the loss, ``Accuracy`` of the training batches) attached to the
trainer. runmodel runs the training; ``engine.ignite`` is a real ignite ``Engine`` that
fires ignite's events from runmodel's phases (docs/ignite.md).

    python examples/ignite_handlers.py [--epochs 30] [--patience 3]

Prints a line per epoch (the ignite metrics, and the evaluator's), then what the handlers
did: the epoch EarlyStopping stopped at, and the files ModelCheckpoint kept (written into
``checkpoints/`` in the current directory).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from ignite.engine import Engine, Events, create_supervised_evaluator
from ignite.handlers import EarlyStopping, ModelCheckpoint, global_step_from_engine
from ignite.metrics import Accuracy, Loss, RunningAverage
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--epochs", type=int, default=30)
parser.add_argument("--patience", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(1200, 20)
y = (x[:, :3] > 0).sum(1)                                  # 4 classes
y = torch.where(torch.rand(1200) < 0.2, torch.randint(4, (1200,)), y)  # 20% label noise
train = DataLoader(TensorDataset(x[:200], y[:200]), batch_size=20, shuffle=True)
val = DataLoader(TensorDataset(x[200:], y[200:]), batch_size=500)
module = nn.Sequential(nn.Linear(20, 256), nn.ReLU(), nn.Linear(256, 4))  # overfits 200 rows
loss_fn = nn.CrossEntropyLoss()
model = runmodel.TorchModel.from_parts(
    module, optimizer=torch.optim.Adam(module.parameters(), lr=3e-3), loss_fn=loss_fn,
    train_data=train)

engine = runmodel.Engine()
trainer = engine.ignite  # read it before engine.run(); state.output is ignite's dict form
RunningAverage(output_transform=lambda out: out["loss"]).attach(trainer, "running_loss")
Accuracy(output_transform=lambda out: (out["y_pred"], out["y"])).attach(trainer, "train_acc")

evaluator = create_supervised_evaluator(module, metrics={"acc": Accuracy(),
                                                         "loss": Loss(loss_fn)})


@trainer.on(Events.EPOCH_COMPLETED)
def validate(trainer: Engine) -> None:
    evaluator.run(val)
    m, v = trainer.state.metrics, evaluator.state.metrics
    print(f"epoch {trainer.state.epoch:2d}  running_loss {m['running_loss']:.3f}  "
          f"train_acc {m['train_acc']:.3f}  val_loss {v['loss']:.4f}  val_acc {v['acc']:.3f}")


def neg_val_loss(evaluator: Engine) -> float:
    return -evaluator.state.metrics["loss"]


stopper = EarlyStopping(patience=args.patience, score_function=neg_val_loss, trainer=trainer)
evaluator.add_event_handler(Events.COMPLETED, stopper)
saver = ModelCheckpoint("checkpoints", filename_prefix="best", n_saved=2, require_empty=False,
                        score_function=neg_val_loss, score_name="neg_val_loss",
                        global_step_transform=global_step_from_engine(trainer))
evaluator.add_event_handler(Events.COMPLETED, saver, {"model": module})

result = engine.run(model, epochs=args.epochs)
print(f"runmodel: {result.ended} after {result.epochs} epochs ({result.reason}); "
      f"running_loss in result.metrics: {result.metrics['running_loss']:.3f}")
print(f"EarlyStopping: best -val_loss {stopper.best_score:.3f}, "
      f"{stopper.counter} epochs without improvement")
print(f"ModelCheckpoint kept: {', '.join(sorted(p.name for p in Path('checkpoints').iterdir()))}")
