"""E2: pretrain on digits 0-4, then a new head on 5-9 with the backbone frozen, its last
linear layer unfrozen from epoch 2 and everything from epoch 4 (benchmarks/README.md)."""

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Unfreeze

torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x_train, x_test, y_train, y_test = train_test_split(x / 16, y, test_size=0.2, random_state=0)


def loader(x, y, first, **options):
    keep = (y >= first) & (y < first + 5)
    return DataLoader(
        TensorDataset(torch.tensor(x[keep]).float(), torch.tensor(y[keep] - first)), **options
    )


def model(backbone, first):
    return runmodel.TorchModel.from_parts(
        nn.Sequential(backbone, nn.Linear(64, 5)),
        optimizer=torch.optim.Adam,
        loss_fn=nn.CrossEntropyLoss(),
        train_data=loader(x_train, y_train, first, batch_size=64, shuffle=True),
        eval_data=loader(x_test, y_test, first, batch_size=256),
    )


backbone = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU())
runmodel.Engine().run(model(backbone, 0), epochs=3)
engine = runmodel.Engine(unfreeze := Unfreeze({0: ["1"], 2: ["0.2"], 4: "all"}))


@engine.on("epoch_start")  # after Unfreeze's: this epoch's frozen tensors
def remember(engine):
    engine.frozen = [p.clone() for p in unfreeze.frozen(engine.state.epoch)]


@engine.on("epoch_end")
def check(engine):
    assert len(engine.frozen) == [4, 4, 2, 2, 0, 0][engine.state.epoch]
    assert all(map(torch.equal, engine.frozen, unfreeze.frozen(engine.state.epoch)))


engine.run(finetuned := model(backbone, 5), epochs=6)
print(f"accuracy on 5-9: {runmodel.evaluate(finetuned)['accuracy']:.4f}")
