"""A custom train step through an override: a small GAN with two optimizers learns a ring
of eight Gaussians in 2-D.

    python examples/gan.py [--epochs 20] [--steps-per-epoch 50]

The model is a ``TorchModel`` made from parts (a generator and a discriminator in one
``ModuleDict``, the generator's optimizer as its optimizer); the step is the script's
``engine.override("runstep")``, which never calls the default action: it updates the
discriminator with its own optimizer, then the generator. Hooks and packs still see each
step (``state.loss`` is the generator's loss, ``state.output`` both losses). A Checkpoint
of this run would keep ``model.optimizer`` only: the discriminator's optimizer would need
a pack of its own whose ``state_dict()`` returns ``d_optimizer.state_dict()``.

Prints, before and after training, the mean distance of generated points to the nearest
of the eight centres, and how many centres have generated points near them.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

import runmodel

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--steps-per-epoch", type=int, default=50)
parser.add_argument("--batch-size", type=int, default=128)
args = parser.parse_args()

torch.manual_seed(0)
RADIUS, SPREAD, NOISE = 2.0, 0.05, 8
angles = torch.arange(8) * (2 * math.pi / 8)
centres = RADIUS * torch.stack([angles.cos(), angles.sin()], dim=1)


def ring(n: int) -> torch.Tensor:
    """n points from the ring: a random centre each, plus Gaussian noise."""
    return centres[torch.randint(8, (n,))] + SPREAD * torch.randn(n, 2)


def mlp(inputs: int, outputs: int) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64),
                         nn.LeakyReLU(0.2), nn.Linear(64, outputs))


generator, discriminator = mlp(NOISE, 2), mlp(2, 1)
model = runmodel.TorchModel.from_parts(
    nn.ModuleDict({"generator": generator, "discriminator": discriminator}),
    optimizer=torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999)),
    loss_fn=nn.BCEWithLogitsLoss(),
    train_data=[(ring(args.batch_size),) for _ in range(args.steps_per_epoch)])
d_optimizer = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
real_label = torch.ones(args.batch_size, 1)
fake_label = torch.zeros(args.batch_size, 1)

engine = runmodel.Engine()


@engine.override("runstep")
def gan_step(engine: runmodel.Engine, default: object) -> None:
    """One discriminator update, then one generator update (default is never called)."""
    (real,) = engine.state.batch
    bce = model.loss_fn
    assert bce is not None and model.optimizer is not None
    fake = generator(torch.randn(len(real), NOISE))
    d_loss = (bce(discriminator(real), real_label)
              + bce(discriminator(fake.detach()), fake_label))
    d_optimizer.zero_grad(set_to_none=True)
    d_loss.backward()
    d_optimizer.step()
    g_loss = bce(discriminator(fake), real_label)  # the generator wants "real"
    model.optimizer.zero_grad(set_to_none=True)
    g_loss.backward()
    model.optimizer.step()
    engine.state.loss = g_loss
    engine.state.output = {"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}


@engine.on("epoch_end", every=max(1, args.epochs // 4))
def report(engine: runmodel.Engine) -> None:
    out = engine.state.output
    print(f"epoch {engine.state.epoch + 1:3d}  d_loss {out['d_loss']:.3f}  "
          f"g_loss {out['g_loss']:.3f}")


@torch.no_grad()
def quality(n: int = 2000) -> tuple[float, int]:
    """Mean distance of n generated points to their nearest centre, and how many centres
    have at least 1% of the points within 3 standard deviations of them."""
    distances = torch.cdist(generator(torch.randn(n, NOISE)), centres)
    nearest, which = distances.min(dim=1)
    near = which[nearest < 3 * SPREAD]
    covered = int((torch.bincount(near, minlength=8) >= 0.01 * n).sum())
    return nearest.mean().item(), covered


before = quality()
result = engine.run(model, epochs=args.epochs)
after = quality()
print(f"{result.steps} steps: distance to the nearest centre {before[0]:.3f} -> {after[0]:.3f}; "
      f"centres covered {before[1]}/8 -> {after[1]}/8")
