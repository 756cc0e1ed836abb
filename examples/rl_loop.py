"""A model that owns an unusual loop: REINFORCE on a corridor written here (no gym).

    python examples/rl_loop.py [--epochs 10] [--updates 10]

The agent starts at the left end of a corridor of ten cells and may step left or right;
reaching the right end pays +1, each move costs 0.02, and an episode ends after 30
moves. An untrained policy gets there in about one episode of four (mean return about
-0.3); the best policy walks straight right (return 0.82).

There is no dataset: the model's ``run`` plays a batch of episodes with its current
policy, then calls ``runstep`` with what it saw, so each step is one policy-gradient
update through the usual ``forward``/``backward``/``optimizer_step`` phases (any pack or
override works on them). A hook prints the mean return of each epoch's episodes.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

import runmodel

CELLS, MAX_MOVES, MOVE_COST, GAMMA = 10, 30, 0.02, 0.99


class Corridor:
    """``n`` corridors side by side, as tensors: positions, and which episodes are done."""

    def __init__(self, n: int) -> None:
        self.position = torch.zeros(n, dtype=torch.long)
        self.done = torch.zeros(n, dtype=torch.bool)

    def observe(self) -> torch.Tensor:
        return nn.functional.one_hot(self.position, CELLS).float()

    def step(self, action: torch.Tensor) -> torch.Tensor:
        """Move right (1) or left (0); the reward of each episode still running."""
        self.position = (self.position + 2 * action - 1).clamp(0, CELLS - 1)
        arrived = self.position == CELLS - 1
        reward = arrived.float() - MOVE_COST
        self.done = self.done | arrived
        return reward


class Reinforce(runmodel.TorchModel):
    init_defaults = {"seed": 0, "episodes": 32}
    setup_defaults = {"lr": 0.01, "updates": 10}

    def __init__(self, device: str | None = None,
                 init_options: dict[str, Any] | None = None) -> None:
        super().__init__(device, init_options)
        torch.manual_seed(self.init_options["seed"])
        self.module = nn.Sequential(nn.Linear(CELLS, 32), nn.Tanh(), nn.Linear(32, 2))

    def setup(self, setup_options: dict[str, Any] | None = None) -> None:
        self.options = setup_options or dict(self.setup_defaults)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=self.options["lr"])
        self.loss_fn = policy_gradient_loss

    @torch.no_grad()
    def rollout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Play a batch of episodes: the observations, actions and discounted returns-to-go
        of every move made, and each episode's total return."""
        env = Corridor(self.init_options["episodes"])
        observations, actions, rewards, alive = [], [], [], []
        for _ in range(MAX_MOVES):
            running = ~env.done
            obs = env.observe()
            action = torch.distributions.Categorical(logits=self.module(obs)).sample()
            reward = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward * running)  # nothing after the goal
            alive.append(running)
        to_go, returns = torch.zeros(len(env.done)), []
        for reward in reversed(rewards):
            to_go = reward + GAMMA * to_go
            returns.append(to_go)
        returns.reverse()
        mask = torch.stack(alive).flatten()
        episode_return = torch.stack(rewards).sum(0)
        return (torch.stack(observations).flatten(0, 1)[mask],
                torch.stack(actions).flatten()[mask], torch.stack(returns).flatten()[mask],
                episode_return)

    def run(self, runstep: runmodel.RunStep, steps: int | None = None, *args: Any,
            **kwargs: Any) -> None:
        """The loop: play, learn from it, repeat; ``runstep`` stops it at the step budget."""
        for _ in runstep.epochs():
            for _ in range(self.options["updates"]):
                runstep(self.rollout())

    def compute_output(self, batch: Any) -> torch.Tensor:
        observations = batch[0]
        return self.module(observations)

    def target(self, batch: Any) -> Any:
        return batch[1:3]  # actions and returns, for the loss


def policy_gradient_loss(logits: torch.Tensor, target: tuple[torch.Tensor, torch.Tensor]
                         ) -> torch.Tensor:
    """REINFORCE: raise the log-probability of each action by how much better its
    return-to-go was than the batch's mean (the baseline)."""
    actions, returns = target
    log_prob = torch.log_softmax(logits, dim=1).gather(1, actions.unsqueeze(1)).squeeze(1)
    return -(log_prob * (returns - returns.mean())).mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--updates", type=int, default=5, help="updates per epoch")
    args = parser.parse_args()

    engine = runmodel.Engine()
    returns: list[torch.Tensor] = []

    @engine.on("runstep")
    def collect(engine: runmodel.Engine) -> None:
        returns.append(engine.state.batch[3])  # the episodes this update learned from

    @engine.on("epoch_end")
    def report(engine: runmodel.Engine) -> None:
        episodes = torch.cat(returns)
        returns.clear()
        print(f"epoch {engine.state.epoch + 1:3d}   mean return {episodes.mean():+.3f}  "
              f"reached the goal {(episodes > 0).float().mean():.0%}")

    model = Reinforce()
    first = model.rollout()[3]  # before any training: the policy is near random
    print(f"untrained   mean return {first.mean():+.3f}  reached the goal "
          f"{(first > 0).float().mean():.0%}")
    result = engine.run(model, epochs=args.epochs,
                        setup_options={"updates": args.updates})
    print(f"{result.steps} updates; best possible return "
          f"{1 - MOVE_COST * (CELLS - 1):+.3f}")


if __name__ == "__main__":
    main()
