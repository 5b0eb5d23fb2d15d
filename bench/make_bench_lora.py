#!/usr/bin/env python3
"""A random rank-R LoRA on every Linear of a diffusers transformer folder, in diffusers/PEFT names
(transformer.<module>.lora_A/B.weight, float16, no alpha: scale 1), for bench/lora_cost.sh.
Random, not a fixture: tests use PEFT-made files (scripts/reference/make_lora_fixtures.py).

    python bench/make_bench_lora.py MODEL_DIR OUT.safetensors [--rank 32]
"""
import argparse
import glob
import json
import os
import struct

import numpy as np
from safetensors.numpy import save_file


def shapes(transformer_dir):
    out = {}
    for path in sorted(glob.glob(os.path.join(transformer_dir, "*.safetensors"))):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for k, v in header.items():
            if k != "__metadata__" and k.endswith(".weight") and len(v["shape"]) == 2:
                out[k[: -len(".weight")]] = v["shape"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    tensors = {}
    for module, (rows, cols) in sorted(shapes(os.path.join(a.model, "transformer")).items()):
        tensors[f"transformer.{module}.lora_A.weight"] = (rng.standard_normal((a.rank, cols)) / np.sqrt(cols)).astype(np.float16)
        tensors[f"transformer.{module}.lora_B.weight"] = (0.01 * rng.standard_normal((rows, a.rank)) / np.sqrt(a.rank)).astype(np.float16)
    save_file(tensors, a.out)
    print(f"{a.out}: {len(tensors) // 2} linears, rank {a.rank}, {os.path.getsize(a.out) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
