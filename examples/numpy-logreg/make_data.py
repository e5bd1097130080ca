#!/usr/bin/env python3
"""Write the tiny binary-classification dataset this example trains on, into ./data/.

Standard library only, and no libm calls: features are Irwin-Hall noise (sum
of 12 MT19937 uniforms minus 6, roughly normal) built with + and *, labels
come from a fixed linear rule plus uniform noise, and struct rounds to
float32. The bytes are the same on any host and any Python 3; data.sha256
(the committed manifest) checks them:

    python3 make_data.py && (cd data && sha256sum -c ../data.sha256)

Files (little-endian, row-major):
    train-x.f32  float32[2000, 8]      train-y.u8  uint8[2000]
    test-x.f32   float32[500, 8]       test-y.u8   uint8[500]
    meta.json    shapes, dtypes and the generator settings
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct

SEED = 7
FEATURES = 8
TRAIN = 2000
TEST = 500
LABEL_NOISE = 1.5  # uniform noise added to the score before thresholding


def normalish(rng: random.Random) -> float:
    # An explicit loop, not sum(): Python 3.12's sum() of floats compensates
    # rounding (Neumaier), which would change the bytes between versions.
    total = 0.0
    for _ in range(12):
        total += rng.random()
    return total - 6.0


def make(rng: random.Random, w: list, bias: float, n: int) -> tuple:
    xs = bytearray()
    ys = bytearray()
    for _ in range(n):
        row = [normalish(rng) for _ in range(FEATURES)]
        score = bias
        for wj, xj in zip(w, row):
            score += wj * xj
        score += LABEL_NOISE * (2.0 * rng.random() - 1.0)
        xs += struct.pack(f"<{FEATURES}f", *row)
        ys.append(1 if score > 0.0 else 0)
    return bytes(xs), bytes(ys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"),
                    help="directory to write (default: data/ beside this script)")
    args = ap.parse_args()
    rng = random.Random(SEED)
    w = [2.0 * rng.random() - 1.0 for _ in range(FEATURES)]
    bias = 0.25
    train_x, train_y = make(rng, w, bias, TRAIN)
    test_x, test_y = make(rng, w, bias, TEST)
    meta = {
        "features": FEATURES, "seed": SEED, "label_noise": LABEL_NOISE,
        "files": {
            "train-x.f32": {"dtype": "<f4", "shape": [TRAIN, FEATURES]},
            "train-y.u8": {"dtype": "u1", "shape": [TRAIN]},
            "test-x.f32": {"dtype": "<f4", "shape": [TEST, FEATURES]},
            "test-y.u8": {"dtype": "u1", "shape": [TEST]},
        },
    }
    os.makedirs(args.out, exist_ok=True)
    outputs = {"train-x.f32": train_x, "train-y.u8": train_y, "test-x.f32": test_x, "test-y.u8": test_y,
               "meta.json": (json.dumps(meta, sort_keys=True, indent=2) + "\n").encode("utf-8")}
    for name, data in sorted(outputs.items()):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(outputs)} files to {args.out}")


if __name__ == "__main__":
    main()
