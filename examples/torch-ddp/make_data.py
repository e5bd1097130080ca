#!/usr/bin/env python3
"""Write the synthetic 4-class dataset this example trains on, into ./data/.

Standard library only, and no libm calls (no log/exp/cos): points are class
centres plus Irwin-Hall noise (sum of 12 uniforms minus 6, roughly normal),
built from MT19937 draws with + and *, then rounded to float32 by struct. So
the bytes are identical on any host and any Python 3, and data.sha256 (the
committed manifest) checks them:

    python3 make_data.py && (cd data && sha256sum -c ../data.sha256)

Files (little-endian, row-major):
    train-x.f32  float32[3000, 16]      train-y.u8  uint8[3000]
    test-x.f32   float32[1000, 16]      test-y.u8   uint8[1000]
    meta.json    shapes, dtypes and the generator settings
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct

SEED = 20240601
FEATURES = 16
CLASSES = 4
TRAIN = 3000
TEST = 1000
NOISE = 1.6  # per-feature spread; classes overlap, so accuracy stays well below 100%


def normalish(rng: random.Random) -> float:
    # An explicit loop, not sum(): Python 3.12's sum() of floats compensates
    # rounding (Neumaier), which would change the bytes between versions.
    total = 0.0
    for _ in range(12):
        total += rng.random()
    return total - 6.0


def make(rng: random.Random, centres: list, n: int) -> tuple:
    xs = bytearray()
    ys = bytearray()
    for _ in range(n):
        label = int(rng.random() * CLASSES)
        c = centres[label]
        # A nonlinear twist (feature 0 squared into feature 1) so a hidden layer helps.
        row = [c[j] + NOISE * normalish(rng) for j in range(FEATURES)]
        row[1] += 0.5 * row[0] * row[0]
        xs += struct.pack(f"<{FEATURES}f", *row)
        ys.append(label)
    return bytes(xs), bytes(ys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"),
                    help="directory to write (default: data/ beside this script)")
    args = ap.parse_args()
    rng = random.Random(SEED)
    centres = [[1.5 * (2.0 * rng.random() - 1.0) for _ in range(FEATURES)] for _ in range(CLASSES)]
    train_x, train_y = make(rng, centres, TRAIN)
    test_x, test_y = make(rng, centres, TEST)
    meta = {
        "classes": CLASSES, "features": FEATURES, "seed": SEED, "noise": NOISE,
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
