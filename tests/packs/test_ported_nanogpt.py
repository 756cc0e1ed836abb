"""nanoGPT's ``train.py``, shrunk to a CPU and a tiny GPT (``tiny_gpt.py``), written as the
script's plain loop and ported to runmodel with the packs, and checked bit for bit: every
number it prints and the final weights, and the weights of its best-val checkpoint.

What the script does, and the pack that does it in the port (no hook of the port's own
evaluates, clips, sets a learning rate or saves; its hooks print):

- random batches sampled by ``get_batch(split)`` from a token stream, the next one drawn
  before the step (the script fetches it right after the forward, which draws nothing):
  the port's ``Model.run``;
- gradient accumulation over ``gas`` micro-steps, each loss divided by ``gas``:
  ``GradAccumulation(gas)``;
- ``get_lr(it)``, a closed-form warm-up and cosine, written into every group at the top
  of each iteration: ``LRSchedule(lr_at=get_lr)``;
- ``clip_grad_norm_(model.parameters(), grad_clip)`` over a decay/no-decay AdamW:
  ``GradClip(max_norm=grad_clip)``;
- ``estimate_loss()`` of train and val over ``eval_iters`` sampled batches at every
  ``iter_num % eval_interval == 0``, iteration 0 included, its losses a float32 tensor's
  mean: ``Evaluate(data={"train": ..., "val": ...}, batches=eval_iters, at_start=True,
  loss_reduction="float32")``;
- ``ckpt.pt`` written when the val loss beats the best so far (iteration 0's being the
  first best, never saved): ``Checkpoint(out_dir, keep=0, best=("val_loss", "min"))``
  in the script's own ``out_dir``, its ``ckpt.pt`` left alone;
- the MFU of its log line: ``Throughput``, whose MFU is ``estimate_mfu``'s where they
  count the same FLOPs (``tiny_gpt.matmul_parameters``: nanoGPT's 6N counts the
  LayerNorms' weights too, which run no matmul).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tiny_gpt import GPT, VOCAB, B, T, matmul_parameters
from torch import nn

import runmodel
from runmodel.packs import Checkpoint, Evaluate, GradAccumulation, GradClip, LRSchedule
from runmodel.packs import throughput as throughput_module
from runmodel.packs.throughput import Throughput

# train.py's configuration, shrunk
EVAL_INTERVAL, EVAL_ITERS, LOG_INTERVAL, MAX_ITERS = 4, 2, 1, 16
GAS = 2  # a power of 2: the script's printed loss.item() * gas is the micro-step's loss
LEARNING_RATE, MIN_LR, WARMUP_ITERS, LR_DECAY_ITERS = 1e-2, 1e-3, 2, 16
WEIGHT_DECAY, BETAS, GRAD_CLIP = 0.1, (0.9, 0.95), 0.5
PEAK, DT = 1e9, 0.25  # a made-up peak FLOP/s, and a fake clock: 0.25 s per micro-step


def token_stream(n: int, seed: int) -> torch.Tensor:
    """A stream with something to learn: mostly each token follows from the last."""
    g = torch.Generator().manual_seed(seed)
    noise, random_tokens = torch.rand(n, generator=g), torch.randint(VOCAB, (n,), generator=g)
    stream = [0]
    for i in range(1, n):
        follows = (stream[-1] * 7 + 3) % VOCAB
        stream.append(follows if noise[i] < 0.8 else int(random_tokens[i]))
    return torch.tensor(stream)


DATA = {"train": token_stream(600, 1), "val": token_stream(200, 2)}


def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """train.py's ``get_batch``, on tensors in memory."""
    data = DATA[split]
    ix = torch.randint(len(data) - T, (B,))
    x = torch.stack([data[i : i + T] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
    return x, y


def get_lr(it: int) -> float:
    """train.py's ``get_lr``, as written there."""
    if it < WARMUP_ITERS:
        return LEARNING_RATE * (it + 1) / (WARMUP_ITERS + 1)
    if it > LR_DECAY_ITERS:
        return MIN_LR
    decay_ratio = (it - WARMUP_ITERS) / (LR_DECAY_ITERS - WARMUP_ITERS)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return MIN_LR + coeff * (LEARNING_RATE - MIN_LR)


def configure_optimizers(module: nn.Module) -> torch.optim.Optimizer:
    """model.py's ``configure_optimizers``: matrices decay, the rest does not."""
    params = [p for p in module.parameters() if p.requires_grad]
    decay_params = [p for p in params if p.dim() >= 2]
    nodecay_params = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay_params, "weight_decay": WEIGHT_DECAY},
        {"params": nodecay_params, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=LEARNING_RATE, betas=BETAS)


#: the loss of model.py's forward, taken out of the module (the module returns logits)
loss_fn = functools.partial(F.cross_entropy, ignore_index=-1)


def new_gpt() -> GPT:
    torch.manual_seed(1337)
    return GPT()


def fake_time(micro_steps: list[int]) -> Callable[[], float]:
    """A clock reading DT seconds per micro-step done (``micro_steps[0]``)."""
    return lambda: micro_steps[0] * DT


def script(out_dir: Path) -> tuple[nn.Module, list[str], list[float]]:
    """train.py's loop (one process, no scaler, dropout 0), what it prints, and each
    log line's MFU (from ``estimate_mfu``, over the fake clock)."""
    model = new_gpt()
    optimizer = configure_optimizers(model)
    micro_steps = [0]
    clock = fake_time(micro_steps)
    printed: list[str] = []
    mfus: list[float] = []

    @torch.no_grad()
    def estimate_loss() -> dict[str, torch.Tensor]:
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(EVAL_ITERS)
            for k in range(EVAL_ITERS):
                X, Y = get_batch(split)
                losses[k] = loss_fn(model(X), Y.view(-1)).item()
            out[split] = losses.mean()
        model.train()
        return out

    X, Y = get_batch("train")  # fetch the very first batch
    t0 = clock()
    iter_num, local_iter_num, best_val_loss, running_mfu = 0, 0, 1e9, -1.0
    while True:
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if iter_num % EVAL_INTERVAL == 0:
            losses = estimate_loss()
            printed.append(
                f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
            )
            if losses["val"] < best_val_loss:
                best_val_loss = losses["val"]
                if iter_num > 0:
                    checkpoint = {"model": model.state_dict(), "iter_num": iter_num}
                    printed.append(f"saving checkpoint to {out_dir}")
                    torch.save(checkpoint, out_dir / "ckpt.pt")
        for _micro_step in range(GAS):
            loss = loss_fn(model(X), Y.view(-1))
            loss = loss / GAS
            X, Y = get_batch("train")  # prefetch the next batch
            loss.backward()
            micro_steps[0] += 1
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t1 = clock()
        dt, t0 = t1 - t0, t1
        if iter_num % LOG_INTERVAL == 0:
            lossf = loss.item() * GAS
            line = f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms"
            if local_iter_num >= 5:  # let the training loop settle a bit
                mfu = estimate_mfu(model, B * GAS, dt)
                running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
                mfus.append(mfu)
                line += f", mfu {running_mfu * 100:.2f}%"
            printed.append(line)
        iter_num += 1
        local_iter_num += 1
        if iter_num > MAX_ITERS:
            break
    return model, printed, mfus


def estimate_mfu(model: GPT, fwdbwd_per_iter: int, dt: float) -> float:
    """model.py's ``estimate_mfu`` (its peak a parameter), N counting the parameters that
    take part in matmuls, as FlopCounterMode counts them."""
    original, n = model.get_num_params, matmul_parameters(model)
    model.get_num_params = lambda: n  # type: ignore[method-assign]
    try:
        return model.estimate_mfu(fwdbwd_per_iter, dt, PEAK)
    finally:
        model.get_num_params = original  # type: ignore[method-assign]


class NanoGPT(runmodel.TorchModel):
    """The port: the model, its optimizer, and train.py's loop over sampled batches (the
    first drawn before training starts, each next one before the step it follows)."""

    def __init__(self, device: Any = None, init_options: Any = None) -> None:
        super().__init__(device, init_options)
        self.module = new_gpt()

    def setup(self, setup_options: Any = None) -> None:
        self.optimizer = configure_optimizers(self.module)
        self.loss_fn = loss_fn  # F.cross_entropy: default metrics loss and accuracy

    def target(self, batch: Any) -> Any:
        return batch[1].view(-1)

    def run(self, runstep: Any, steps: int | None = None, *args: Any, **kwargs: Any) -> None:
        batch = get_batch("train")  # fetch the very first batch
        for _ in runstep.epochs():  # one epoch, as long as the budget
            while True:
                this, batch = batch, get_batch("train")
                runstep(this)


def port(
    out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[NanoGPT, list[str], list[float], Checkpoint]:
    every = f"{EVAL_INTERVAL}it"  # the runstep that ends every EVAL_INTERVAL-th iteration
    evaluate = Evaluate(
        every=every,
        data={"train": lambda: get_batch("train"), "val": lambda: get_batch("val")},
        batches=EVAL_ITERS,
        at_start=True,
        loss_reduction="float32",  # losses.mean() of a float32 tensor
    )
    checkpoint = Checkpoint(out_dir, every=every, keep=0, best=("val_loss", "min"))
    throughput = Throughput(every="1it", items_per_batch=B * T, peak_flops=PEAK)
    engine = runmodel.Engine(
        GradAccumulation(GAS),
        LRSchedule(lr_at=get_lr),
        GradClip(max_norm=GRAD_CLIP),
        evaluate,
        checkpoint,
        throughput,
        progress=False,
    )
    monkeypatch.setattr(throughput_module, "clock", lambda: (engine.state.step + 1) * DT)
    printed: list[str] = []
    mfus: list[float] = []

    best = [None]

    # at the top of every EVAL_INTERVAL-th iteration, 0 included (`iter_num % eval_interval
    # == 0`), as the script prints there: the evaluation Evaluate made at the end of the
    # previous iteration (or at the start), and whether Checkpoint saved a new best then
    @engine.on("step_start", every=f"{EVAL_INTERVAL}it", from_zero=True)
    def print_losses(engine: runmodel.Engine) -> None:
        m, it = engine.state.metrics, engine.state.iteration
        printed.append(f"step {it}: train loss {m['train_loss']:.4f}, val loss {m['val_loss']:.4f}")
        if checkpoint.best_path != best[0]:
            best[0] = checkpoint.best_path
            printed.append(f"saving checkpoint to {out_dir}")

    running_mfu = [-1.0]

    # the line of the iteration just done, with the Throughput's report
    @engine.on("runstep", every=f"{LOG_INTERVAL}it", after="throughput.report")
    def log(engine: runmodel.Engine) -> None:
        s, it = engine.state, engine.state.iteration
        line = f"iter {it}: loss {s.loss.item():.4f}, time {DT * GAS * 1000:.2f}ms"
        if it >= 5:
            mfu = s.metrics["mfu"]
            running_mfu[0] = mfu if running_mfu[0] == -1.0 else 0.9 * running_mfu[0] + 0.1 * mfu
            mfus.append(mfu)
            line += f", mfu {running_mfu[0] * 100:.2f}%"
        printed.append(line)

    model = NanoGPT(device="cpu")
    engine.run(model, iterations=MAX_ITERS + 1)
    return model, printed, mfus, checkpoint


def test_nanogpt_ported_with_the_packs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    plain, expected, expected_mfus = script(out_dir)
    model, printed, mfus, checkpoint = port(out_dir, monkeypatch)  # the script's out_dir
    assert printed == expected
    assert sum(line.startswith("saving") for line in printed) >= 1  # a best after iteration 0
    for mine, theirs in zip(model.module.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    # the best checkpoint holds the weights the script's ckpt.pt holds
    assert checkpoint.best_path is not None
    ours = torch.load(checkpoint.best_path, weights_only=True)["model"]["module"]
    theirs = torch.load(out_dir / "ckpt.pt", weights_only=True)["model"]
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    # MFU: estimate_mfu's formula, over the same FLOPs
    assert len(mfus) == len(expected_mfus) == MAX_ITERS + 1 - 5
    assert mfus == pytest.approx(expected_mfus, rel=1e-12)
