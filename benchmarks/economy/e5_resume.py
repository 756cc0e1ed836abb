"""E5: E1's model for 6 epochs with a checkpoint every epoch; --crash-at N raises at the
start of epoch N; the same command again continues from the last checkpoint and prints
the accuracy an uninterrupted run prints (benchmarks/README.md)."""

import argparse
import os

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Checkpoint, Evaluate

parser = argparse.ArgumentParser()
parser.add_argument("--crash-at", type=int)
parser.add_argument("--dir", default="runs/e5")
args = parser.parse_args()

torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x_train, x_test, y_train, y_test = train_test_split(x / 16, y, test_size=0.2, random_state=0)


def loader(x, y, **options):
    return DataLoader(TensorDataset(torch.tensor(x).float(), torch.tensor(y)), **options)


model = runmodel.TorchModel.from_parts(
    nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)),
    optimizer=torch.optim.Adam,
    loss_fn=nn.CrossEntropyLoss(),
    train_data=loader(x_train, y_train, batch_size=64, shuffle=True),
    eval_data=loader(x_test, y_test, batch_size=256),
)
engine = runmodel.Engine(Evaluate(), Checkpoint(args.dir))


if not os.path.isdir(args.dir):  # the first run only, not the one that resumes

    @engine.on("epoch_start", when=lambda engine: engine.state.epoch == args.crash_at)
    def crash(engine):
        raise RuntimeError(f"crash at the start of epoch {args.crash_at}")


result = engine.run(model, epochs=6, resume="auto")
print(f"test accuracy {result.metrics['eval_accuracy']:.6f}")
