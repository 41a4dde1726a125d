"""A complete training script for gavel: a small regression network on synthetic data.

Run it by hand (it trains --steps steps and stops):

    python docs/examples/train.py --steps 200 --checkpoint-dir /tmp/ckpt

or on a cluster (a real worker runs it under leases, stopping and resuming it as scheduled):

    gavel submit --job-type "ResNet-18 (batch size 32)" --steps 2000 \
        --command "python train.py --lr 0.05" --working-dir docs/examples

The only gavel-specific lines are the import, the two checkpoint functions and the LeaseIterator
around the data loader. Everything else is plain PyTorch.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch import nn

from worker_service.training import LeaseIterator


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None, help="by hand: how many steps (a worker gives its own budget)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-dir", help="by hand: where to keep checkpoints (a worker gives its own)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("GAVEL_NUM_THREADS", "1")))
    device = "cuda" if os.environ.get("GAVEL_DEVICE") == "cuda" else "cpu"

    # Synthetic data with a fixed seed: y = x @ w_true + noise, 64 batches of 32.
    generator = torch.Generator().manual_seed(1)
    w_true = torch.randn(16, 1, generator=generator)
    xs = torch.randn(64, 32, 16, generator=generator)
    data = [(x, x @ w_true + 0.01 * torch.randn(32, 1, generator=generator)) for x in xs]

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    def save_checkpoint(directory: Path) -> None:  # gavel gives an empty directory
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, directory / "state.pt")

    def load_checkpoint(directory: Path) -> None:  # the newest checkpoint this job may resume from
        state = torch.load(directory / "state.pt", map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    batches = LeaseIterator(
        data, save_checkpoint=save_checkpoint, load_checkpoint=load_checkpoint, steps=args.steps,
        checkpoint_dir=args.checkpoint_dir,
    )
    loss = torch.tensor(0.0)
    for x, y in batches:  # restores the last checkpoint first; stops at the lease's end
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
    print(f"step {batches.step} loss {loss.item():.4f} done={batches.done}")


if __name__ == "__main__":
    main()
