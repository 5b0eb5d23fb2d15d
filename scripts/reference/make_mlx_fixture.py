"""Writes tests/data/mlx/: one Linear weight quantized by MLX itself (mx.quantize, saved with
mx.save_safetensors) in the layout klein computes (4-bit, groups of 64) and in one it refuses
(8-bit, groups of 32, the same 256 bits per group), with mlx-lm's config.json entries and MLX's
own dequantization of the 4-bit one. tests/test_loader.cpp reads them: an independent writer of the format.

    python3 -m venv /work/venv-mlx && /work/venv-mlx/bin/pip install 'mlx[cpu]' numpy
    /work/venv-mlx/bin/python scripts/reference/make_mlx_fixture.py

Made with mlx 0.32.4 on the CPU. Deterministic: the weight is a formula, not random draws.
"""
import json
import os

import mlx.core as mx
import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "mlx")
ROWS, COLS = 8, 128


def main():
    os.makedirs(OUT, exist_ok=True)
    r = np.arange(ROWS, dtype=np.float32)[:, None]
    c = np.arange(COLS, dtype=np.float32)[None, :]
    w = mx.array(np.sin(0.37 * r + 0.11 * c) * (1.0 + 0.25 * r)).astype(mx.bfloat16)  # MLX checkpoints: bf16
    for bits, group in [(4, 64), (8, 32)]:
        q, s, b = mx.quantize(w, group_size=group, bits=bits)
        name = f"q{bits}g{group}"
        mx.save_safetensors(os.path.join(OUT, name + ".safetensors"),
                            {"lin.weight": q, "lin.scales": s, "lin.biases": b})
        if (bits, group) == (4, 64):  # what klein must compute from it
            # In float32, as klein computes it (MLX would round a bf16 result to bf16).
            deq = mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32), group_size=group, bits=bits)
            mx.save_safetensors(os.path.join(OUT, name + "_dequantized.safetensors"), {"lin.weight": deq})
        # What mlx-lm's convert writes into config.json for the model.
        with open(os.path.join(OUT, name + "_config.json"), "w") as f:
            json.dump({"quantization": {"group_size": group, "bits": bits}}, f, indent=2)
            f.write("\n")
        print(name, q.shape, s.shape, s.dtype)


if __name__ == "__main__":
    main()
