"""Digits from parts, with the everyday packs: progress, evaluation each epoch, the best
checkpoint by test accuracy, TensorBoard, early stopping. No subclass, no hooks written.

    python examples/digits_packs.py [--epochs 30]      # writes into runs/digits-packs/
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Checkpoint, EarlyStopping, Evaluate, Progress, TensorBoard

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=30)
args = parser.parse_args()

torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
data = TensorDataset(torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y))
train, test = torch.utils.data.random_split(data, [1437, 360])
model = runmodel.TorchModel.from_parts(
    nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)),
    optimizer=lambda params: torch.optim.Adam(params, lr=5e-3), loss_fn=nn.CrossEntropyLoss(),
    train_data=DataLoader(train, batch_size=64, shuffle=True), eval_data=DataLoader(test, 256))

engine = runmodel.Engine()
engine.attach(Progress(), Evaluate(), TensorBoard("runs/digits-packs/tensorboard"),
              Checkpoint("runs/digits-packs/checkpoints", best=("eval_accuracy", "max")),
              EarlyStopping("eval_loss", patience=3))
result = engine.run(model, epochs=args.epochs)
print(f"{result.ended} after {result.epochs} epochs ({result.reason or 'all epochs ran'}); "
      f"test accuracy {result.metrics['eval_accuracy']:.2%}")
