"""E1: a digits classifier with test accuracy every epoch, a progress bar (on a terminal),
TensorBoard scalars and the best checkpoint by test accuracy (benchmarks/README.md)."""

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Checkpoint, Evaluate, TensorBoard

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
checkpoint = Checkpoint("runs/e1", best=("eval_accuracy", "max"))
result = runmodel.Engine(Evaluate(), TensorBoard("runs/e1"), checkpoint).run(model, epochs=10)
print(f"test accuracy {result.metrics['eval_accuracy']:.4f}; best: {checkpoint.best_saved[0][1]}")
