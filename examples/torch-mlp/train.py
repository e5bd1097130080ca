#!/usr/bin/env python3
"""Train a small MLP on the synthetic dataset, repeatably and resumably.

What it exercises: a shuffling DataLoader with 2 workers and a per-sample
augmentation drawn in the workers, dropout, SGD with momentum and a StepLR
schedule, strict determinism (hermetic_runtime), a checkpoint halfway through
training (mid-epoch) and a resume path that continues bit for bit.

    python train.py --epochs 3                       # inside `hermetic run`
    python train.py --stop-after-checkpoint          # stop right after the halfway checkpoint
    python train.py --resume                         # continue from it

Outputs (in $HERMETIC_OUTPUTS, default /outputs): metrics.jsonl,
weights.bin + weights.json (raw little-endian tensors, byte-stable) and
checkpoint.pt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, Dataset

import hermetic_runtime as hr

HERE = Path(__file__).resolve().parent
# The dataset's mount point in hermetic.yaml (datasets[0].mount).
DEFAULT_DATA = "/data/synth"
CHECKPOINT = "checkpoint.pt"


def parse_args(argv: list[str]) -> argparse.Namespace:
    params = yaml.safe_load((HERE / "params.yaml").read_text())
    ap = argparse.ArgumentParser(description="Train the example MLP (see README.md).")
    ap.add_argument("--data", default=os.environ.get("DATA_DIR", DEFAULT_DATA),
                    help=f"dataset directory (default: $DATA_DIR, else {DEFAULT_DATA})")
    ap.add_argument("--outputs", default=None, help="outputs directory (default: $HERMETIC_OUTPUTS, else /outputs)")
    ap.add_argument("--seed", type=int, default=None, help="default: $HERMETIC_SEED (hermetic.yaml determinism.seed)")
    ap.add_argument("--resume", action="store_true", help="continue from the halfway checkpoint in the outputs")
    ap.add_argument("--stop-after-checkpoint", action="store_true", help="exit right after writing the checkpoint")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (strict mode makes CUDA runs repeatable too)")
    for key, value in params.items():
        ap.add_argument("--" + key.replace("_", "-"), type=type(value), default=value, help=f"(default: {value})")
    return ap.parse_args(argv)


class NoisySynth(Dataset):
    """The float32 features with fresh Gaussian noise per sample, drawn from
    the torch RNG of whichever DataLoader worker loads it."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, noise: float):
        self.x, self.y, self.noise = x, y, noise

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i] + self.noise * torch.randn(self.x.shape[1]), self.y[i]


def load_split(data: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    meta = json.loads((data / "meta.json").read_text())
    shape = meta["files"][f"{split}-x.f32"]["shape"]
    x = np.fromfile(data / f"{split}-x.f32", dtype="<f4").reshape(shape)
    y = np.fromfile(data / f"{split}-y.u8", dtype="u1")
    return torch.from_numpy(x.copy()), torch.from_numpy(y.astype(np.int64))


def make_model(features: int, hidden: int, classes: int, dropout: float) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(hidden, classes),
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.outputs:
        os.environ[hr.OUTPUTS_ENV] = args.outputs
    hr.enable_determinism()           # mode: $HERMETIC_DETERMINISM (strict in hermetic.yaml)
    hr.seed_everything(args.seed)     # seed: --seed, else $HERMETIC_SEED

    data = Path(args.data)
    train_x, train_y = load_split(data, "train")
    test_x, test_y = load_split(data, "test")
    classes = int(json.loads((data / "meta.json").read_text())["classes"])

    device = torch.device(args.device)
    test_x, test_y = test_x.to(device), test_y.to(device)
    model = make_model(train_x.shape[1], args.hidden, classes, args.dropout).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.lr_gamma)
    loss_fn = nn.CrossEntropyLoss()

    loader_gen = hr.dataloader_generator()
    loader = DataLoader(
        NoisySynth(train_x, train_y, args.input_noise), batch_size=args.batch_size, shuffle=True,
        num_workers=args.workers, generator=loader_gen, worker_init_fn=hr.make_worker_init_fn(),
        persistent_workers=False,  # persistent workers would keep pre-resume seeds
    )
    steps_per_epoch = len(loader)
    checkpoint_step = args.epochs * steps_per_epoch // 2
    ckpt_path = hr.outputs_dir() / CHECKPOINT

    start_epoch, start_batch, step = 0, 0, 0
    loss_sum, seen = 0.0, 0
    if args.resume:
        ck = hr.load_checkpoint(ckpt_path, model=model, optimizer=optimizer, scheduler=scheduler,
                                generators={"loader": loader_gen})
        start_epoch, start_batch = ck.epoch, ck.batch
        step, loss_sum, seen = ck.extra["step"], ck.extra["loss_sum"], ck.extra["seen"]
        hr.trim_metrics(step)  # lines an interrupted run logged after the checkpoint
        print(f"resumed at epoch {start_epoch}, batch {start_batch} (step {step})", file=sys.stderr)

    for epoch in range(start_epoch, args.epochs):
        hr.seed_epoch(loader_gen, epoch)  # data order = f(seed, rank, epoch): resumable mid-epoch
        skip = start_batch if epoch == start_epoch else 0
        model.train()
        for batch, (xb, yb) in enumerate(loader):
            if batch < skip:
                continue  # iterate, not slice the sampler: workers' RNGs advance as before
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            step += 1
            loss_sum += loss.item() * len(yb)
            seen += len(yb)
            hr.log_metrics(step, epoch=epoch, loss=loss.item())
            if step == checkpoint_step:
                digest = hr.save_checkpoint(
                    ckpt_path, model=model, optimizer=optimizer, scheduler=scheduler,
                    generators={"loader": loader_gen}, epoch=epoch, batch=batch + 1,
                    extra={"step": step, "loss_sum": loss_sum, "seen": seen})
                print(f"checkpoint at step {step}: {ckpt_path} sha256={digest}", file=sys.stderr)
                if args.stop_after_checkpoint:
                    return 0
        scheduler.step()
        model.eval()
        with torch.no_grad():
            logits = model(test_x)
            test_loss = loss_fn(logits, test_y).item()
            test_acc = (logits.argmax(1) == test_y).sum().item() / len(test_y)
        hr.log_metrics(step, epoch=epoch, train_loss=loss_sum / seen, test_loss=test_loss,
                       test_acc=test_acc, lr=scheduler.get_last_lr()[0])
        print(f"epoch {epoch}: train_loss={loss_sum / seen:.4f} test_acc={test_acc:.4f}", file=sys.stderr)
        loss_sum, seen = 0.0, 0

    weights = hr.save_weights({k: v.cpu() for k, v in model.state_dict().items()})
    print(f"weights: {weights}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
