"""E3: a GAN on a ring of 8 Gaussians, two optimizers, one discriminator update then one
generator update a step (benchmarks/README.md)."""

import math

import torch
from torch import nn

import runmodel

torch.manual_seed(0)
angles = torch.arange(8) * (2 * math.pi / 8)
centres = 2 * torch.stack([angles.cos(), angles.sin()], dim=1)
ring = [centres[torch.randint(8, (128,))] + 0.05 * torch.randn(128, 2) for _ in range(2000)]


def mlp(inputs, outputs):
    return nn.Sequential(nn.Linear(inputs, 64), nn.LeakyReLU(0.2), nn.Linear(64, outputs))


generator, discriminator = mlp(8, 2), mlp(2, 1)
g_optimizer = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
d_optimizer = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
bce, real, fake = nn.BCEWithLogitsLoss(), torch.ones(128, 1), torch.zeros(128, 1)
engine = runmodel.Engine()


@engine.override("runstep")
def gan_step(engine, default):
    points = generator(torch.randn(128, 8))
    d_loss = bce(discriminator(engine.state.batch), real) + bce(
        discriminator(points.detach()), fake
    )
    d_optimizer.zero_grad()
    d_loss.backward()
    d_optimizer.step()
    g_loss = bce(discriminator(points), real)
    g_optimizer.zero_grad()
    g_loss.backward()
    g_optimizer.step()
    return {"loss": g_loss, "d_loss": d_loss}


engine.run(
    runmodel.TorchModel.from_parts(nn.ModuleList([generator, discriminator]), train_data=ring)
)
print(f"d_loss {engine.state.output['d_loss']:.4f}  g_loss {engine.state.loss:.4f}")
