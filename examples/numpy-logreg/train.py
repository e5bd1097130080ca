#!/usr/bin/env python3
"""Logistic regression with minibatch SGD, numpy only: the quick example.

Seeds come from hermetic_runtime (the numpy Generator it returns shuffles the
data and initializes the weights); a checkpoint is written at the end of the
middle epoch and ``--resume`` continues from it bit for bit.

    python train.py --epochs 3               # inside `hermetic run`
    python train.py --stop-after-checkpoint  # stop right after the halfway checkpoint
    python train.py --resume                 # continue from it

Outputs (in $HERMETIC_OUTPUTS, default /outputs): metrics.jsonl,
weights.bin + weights.json, checkpoint.ckpt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

import hermetic_runtime as hr

# The dataset's mount point in hermetic.yaml (datasets[0].mount).
DEFAULT_DATA = "/data/logreg"
CHECKPOINT = "checkpoint.ckpt"


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train the example logistic regression (see README.md).")
    ap.add_argument("--data", default=os.environ.get("DATA_DIR", DEFAULT_DATA),
                    help=f"dataset directory (default: $DATA_DIR, else {DEFAULT_DATA})")
    ap.add_argument("--outputs", default=None, help="outputs directory (default: $HERMETIC_OUTPUTS, else /outputs)")
    ap.add_argument("--seed", type=int, default=None, help="default: $HERMETIC_SEED (hermetic.yaml determinism.seed)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--l2", type=float, default=1e-4)
    ap.add_argument("--resume", action="store_true", help="continue from the halfway checkpoint in the outputs")
    ap.add_argument("--stop-after-checkpoint", action="store_true", help="exit right after writing the checkpoint")
    return ap.parse_args(argv)


def load_split(data: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    meta = json.loads((data / "meta.json").read_text())
    shape = meta["files"][f"{split}-x.f32"]["shape"]
    x = np.fromfile(data / f"{split}-x.f32", dtype="<f4").reshape(shape).astype(np.float64)
    y = np.fromfile(data / f"{split}-y.u8", dtype="u1").astype(np.float64)
    return x, y


def loss_and_acc(x: np.ndarray, y: np.ndarray, w: np.ndarray, b: float) -> tuple[float, float]:
    z = x @ w + b
    loss = float(np.mean(np.logaddexp(0.0, z) - y * z))  # log-loss without overflow
    acc = float(np.mean((z > 0) == (y > 0.5)))
    return loss, acc


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.outputs:
        os.environ[hr.OUTPUTS_ENV] = args.outputs
    hr.enable_determinism()
    rng = hr.seed_everything(args.seed).numpy_generator

    data = Path(args.data)
    train_x, train_y = load_split(data, "train")
    test_x, test_y = load_split(data, "test")
    n, d = train_x.shape

    w = rng.normal(0.0, 0.01, size=d)
    b = 0.0
    step, start_epoch = 0, 0
    checkpoint_epoch = args.epochs // 2  # checkpoint when this many epochs are done
    ckpt_path = hr.outputs_dir() / CHECKPOINT
    if args.resume:
        ck = hr.load_checkpoint(ckpt_path, generators={"numpy": rng})
        start_epoch, step = ck.epoch, ck.extra["step"]
        w, b = np.array(ck.extra["w"], dtype=np.float64), float(ck.extra["b"])
        hr.trim_metrics(step)
        print(f"resumed at epoch {start_epoch} (step {step})", file=sys.stderr)

    for epoch in range(start_epoch, args.epochs):
        order = rng.permutation(n)
        for lo in range(0, n, args.batch_size):
            idx = order[lo:lo + args.batch_size]
            xb, yb = train_x[idx], train_y[idx]
            p = 1.0 / (1.0 + np.exp(-np.clip(xb @ w + b, -30.0, 30.0)))
            err = p - yb
            w = w - args.lr * (xb.T @ err / len(idx) + args.l2 * w)
            b = b - args.lr * float(np.mean(err))
            step += 1
        train_loss, train_acc = loss_and_acc(train_x, train_y, w, b)
        test_loss, test_acc = loss_and_acc(test_x, test_y, w, b)
        hr.log_metrics(step, epoch=epoch, train_loss=train_loss, train_acc=train_acc,
                       test_loss=test_loss, test_acc=test_acc)
        if epoch + 1 == checkpoint_epoch:
            # Plain lists: the checkpoint then loads with torch's weights_only too.
            digest = hr.save_checkpoint(ckpt_path, generators={"numpy": rng}, epoch=epoch + 1, batch=0,
                                        extra={"step": step, "w": w.tolist(), "b": b})
            print(f"checkpoint after epoch {epoch}: {ckpt_path} sha256={digest}", file=sys.stderr)
            if args.stop_after_checkpoint:
                return 0

    print(f"final: test_loss={test_loss:.4f} test_acc={test_acc:.4f}", file=sys.stderr)
    hr.save_weights({"w": w, "b": np.array([b])})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
