"""Fine-tuning layer by layer: pretrain an MLP on the digits 0-4, then fine-tune it on the
digits 5-9 with the ``Unfreeze`` pack, which trains only the head in the first epoch, the
head and the upper hidden layer in the second, and everything from the third.

    python examples/finetune_unfreeze.py [--pretrain-epochs 8] [--epochs 4]

Prints the accuracy on 5-9 before and after fine-tuning and, per fine-tuning epoch, which
layers trained and that the frozen ones did not move (bit for bit). The weights at each
fine-tuning epoch's start and end are saved to ``finetune_weights.pt`` (in the current
directory) so that can be checked from outside too.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Unfreeze

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--pretrain-epochs", type=int, default=8)
parser.add_argument("--epochs", type=int, default=4, help="fine-tuning epochs")
args = parser.parse_args()

torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y)


def loaders(digits: range) -> tuple[DataLoader, DataLoader]:
    """Train (80%) and test (20%) loaders of the given digits only."""
    keep = torch.isin(y, torch.tensor(list(digits)))
    xs, ys = x[keep], y[keep]
    cut = int(0.8 * len(xs))
    return (DataLoader(TensorDataset(xs[:cut], ys[:cut]), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(xs[cut:], ys[cut:]), batch_size=256))


# named layers, so that a schedule can say which: "lower", "upper", "head"
module = nn.Sequential(OrderedDict(
    lower=nn.Linear(64, 64), act1=nn.ReLU(), upper=nn.Linear(64, 64), act2=nn.ReLU(),
    head=nn.Linear(64, 10)))

# 1. pretrain everything on 0-4
train, test = loaders(range(0, 5))
model = runmodel.TorchModel.from_parts(
    module, optimizer=lambda params: torch.optim.Adam(params, lr=3e-3),
    loss_fn=nn.CrossEntropyLoss(), train_data=train, eval_data=test)
runmodel.Engine().run(model, epochs=args.pretrain_epochs)
print(f"pretrained on 0-4: accuracy on 0-4 "
      f"{runmodel.evaluate(model)['accuracy']:.1%}")

# 2. fine-tune on 5-9, unfreezing from the top down; the optimizer covers every parameter
#    (frozen ones get no gradient, so no optimizer state and no weight decay)
model.train_data, model.eval_data = loaders(range(5, 10))
model.optimizer = torch.optim.Adam(module.parameters(), lr=3e-3, weight_decay=1e-4)
print(f"before fine-tuning: accuracy on 5-9 {runmodel.evaluate(model)['accuracy']:.1%}")

engine = runmodel.Engine()
unfreeze = Unfreeze({0: ["head"], 1: ["upper"], 2: "all"})
engine.attach(unfreeze)
snapshots: list[dict[str, dict[str, torch.Tensor]]] = []


def copy() -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


@engine.on("epoch_start")  # priority 0: after Unfreeze's (100) has set this epoch's frozen set
def remember(engine: runmodel.Engine) -> None:
    snapshots.append({"start": copy()})


def layers(names: list[str]) -> str:
    return ", ".join(sorted({n.split(".")[0] for n in names}))


@engine.on("epoch_end")
def check(engine: runmodel.Engine) -> None:
    epoch, start, end = engine.state.epoch, snapshots[-1]["start"], copy()
    snapshots[-1]["end"] = end
    frozen_ids = {id(p) for p in unfreeze.frozen(epoch)}
    frozen = [n for n, p in module.named_parameters() if id(p) in frozen_ids]
    trained = [n for n, p in module.named_parameters() if id(p) not in frozen_ids]
    unchanged = all(torch.equal(start[n], end[n]) for n in frozen)
    moved = all(not torch.equal(start[n], end[n]) for n in trained)
    print(f"epoch {epoch}: trained {layers(trained)} (moved: {'yes' if moved else 'NO'}); "
          + (f"frozen {layers(frozen)} (unchanged: {'yes' if unchanged else 'NO'})" if frozen
             else "nothing frozen"))


result = engine.run(model, epochs=args.epochs)
torch.save(snapshots, "finetune_weights.pt")
print(f"after fine-tuning: accuracy on 5-9 {runmodel.evaluate(model)['accuracy']:.1%} "
      f"({result.epochs} epochs, {result.steps} steps)")
