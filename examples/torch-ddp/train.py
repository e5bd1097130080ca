#!/usr/bin/env python3
"""A small DistributedDataParallel training on CPU (gloo), repeatable bit for bit.

    hermetic run --nproc-per-node 2 train.py      # 2 processes (torchrun in the container)
    hermetic run --nproc-per-node 1 train.py      # the same script, world size 1
    python train.py                               # one process, no process group at all

What a multi-process run adds to what can vary between two runs, and what
handles it here:

- which samples each rank sees, in which order: a DistributedSampler with
  shuffle=True whose seed is the run's seed, the same on every rank
  (``hr.shared_seed()``), and ``set_epoch`` every epoch;
- each rank's own randomness (dropout): ``hr.seed_everything()`` gives rank r
  its own seed derived from (seed, r) (rank 0 keeps the run's seed);
- the gradient all-reduce: gloo's ring on CPU, the same order for the same
  world size; a different world size changes the sums, and `hermetic diff`
  says so (distributed: world size 1 -> 2).

Rank 0 logs the metrics and writes the weights (the run's outputs); the
global batch is split across ranks, so the run's hyperparameters do not
depend on the world size.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import hermetic_runtime as hr

DEFAULT_DATA = "/data/synth"  # hermetic.yaml datasets[0].mount


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train the example MLP with DDP (see README.md).")
    ap.add_argument("--data", default=os.environ.get("DATA_DIR", DEFAULT_DATA))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=64, help="split evenly across the ranks")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--dropout", type=float, default=0.1)
    return ap.parse_args(argv)


def load_split(data: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    meta = json.loads((data / "meta.json").read_text())
    shape = meta["files"][f"{split}-x.f32"]["shape"]
    x = np.fromfile(data / f"{split}-x.f32", dtype="<f4").reshape(shape)
    y = np.fromfile(data / f"{split}-y.u8", dtype="u1")
    return torch.from_numpy(x.copy()), torch.from_numpy(y.astype(np.int64))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    hr.enable_determinism()
    info = hr.init_distributed()  # None when started as one plain process
    rank, world = (info.rank, info.world_size) if info else (0, 1)
    hr.seed_everything()  # this rank's seed, derived from (seed, rank)
    if args.global_batch % world:
        print(f"--global-batch {args.global_batch} does not split across {world} ranks", file=sys.stderr)
        return 2

    data = Path(args.data)
    train_x, train_y = load_split(data, "train")
    test_x, test_y = load_split(data, "test")
    classes = int(json.loads((data / "meta.json").read_text())["classes"])

    # The initial weights come from one generator seeded with the shared seed: equal on every
    # rank and for every world size (DDP would broadcast rank 0's anyway).
    init = torch.Generator().manual_seed(hr.shared_seed())
    model = nn.Sequential(nn.Linear(train_x.shape[1], args.hidden), nn.ReLU(), nn.Dropout(args.dropout),
                          nn.Linear(args.hidden, classes))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.empty_like(p).uniform_(-0.2, 0.2, generator=init))
    ddp = DistributedDataParallel(model) if info else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    # Same seed on every rank: each rank takes its own slice of one permutation per epoch.
    sampler = DistributedSampler(TensorDataset(train_x, train_y), num_replicas=world, rank=rank, shuffle=True,
                                 seed=hr.shared_seed(), drop_last=True)
    loader = DataLoader(TensorDataset(train_x, train_y), batch_size=args.global_batch // world, sampler=sampler)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        total = torch.zeros(2, dtype=torch.float64)  # loss sum, samples
        for xb, yb in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(xb), yb)
            loss.backward()  # DDP all-reduces (averages) the gradients here
            optimizer.step()
            step += 1
            total += torch.tensor([loss.item() * len(yb), len(yb)], dtype=torch.float64)
        if info:
            dist.all_reduce(total)  # every rank's share of the epoch
        ddp.eval()
        with torch.no_grad():
            logits = model(test_x)
            test_loss = loss_fn(logits, test_y).item()
            test_acc = (logits.argmax(1) == test_y).sum().item() / len(test_y)
        if rank == 0:
            hr.log_metrics(step, epoch=epoch, train_loss=(total[0] / total[1]).item(), test_loss=test_loss,
                           test_acc=test_acc, world_size=world)
            print(f"epoch {epoch}: world {world} test_loss={test_loss:.5f} test_acc={test_acc:.4f}", file=sys.stderr)
    if rank == 0:
        print(f"weights: {hr.save_weights(model.state_dict())}", file=sys.stderr)
    if info:
        # DDP's reducer goes before the process group it talks through: left for the end of main(),
        # it was torn down after destroy_process_group and, now and then, never finished (gloo, 2 nodes)
        del ddp, optimizer, loss
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
