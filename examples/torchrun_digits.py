"""Handwritten digits in 2 processes with DistributedDataParallel, started by torchrun.

    torchrun --standalone --nproc-per-node 2 examples/torchrun_digits.py
    torchrun --standalone --nproc-per-node 2 examples/torchrun_digits.py --epochs 10  # on to 10
    runmodel run examples/digits.py --nproc-per-node 2 --epochs 10   # the same, by the command

The model is examples/digits.py's, unchanged: ``backend="ddp"`` is all it takes. Each
process trains on its half of every epoch (batches of 64 each: 128 a step in all, the
gradients averaged between them), evaluates on its half of the test split, and the
accuracy adds up across the two; process rank 0 alone writes the checkpoints and prints.
Run again, it continues from its newest checkpoint (``resume="auto"``): the second command
above trains epochs 6 to 10; delete runs/torchrun-digits to start over.
On CUDA machines each process takes one GPU (nccl); here, the CPU (gloo).
"""

from __future__ import annotations

import argparse
import os

from digits import Digits  # examples/digits.py: torchrun puts the script's folder on the path

import runmodel
from runmodel.packs import Checkpoint, Evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description="digits in several processes (torchrun)")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    engine = runmodel.Engine()
    engine.attach(Evaluate(), Checkpoint("runs/torchrun-digits", every="1ep"))
    result = engine.run(Digits(), epochs=args.epochs, backend="ddp", resume="auto")
    if os.environ.get("RANK", "0") == "0":
        print(f"{result.ended} after {result.epochs} epochs, {result.steps} steps in each of "
              f"{os.environ.get('WORLD_SIZE', '1')} processes; test accuracy "
              f"{result.metrics['eval_accuracy']:.2%}")


if __name__ == "__main__":
    main()
