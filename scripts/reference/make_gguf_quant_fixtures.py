#!/usr/bin/env python3
"""Fixtures for klein's GGUF quantizers (src/core/quantize_gguf.cpp, tests/test_gguf_write.cpp):
rows of floats and the blocks ggml's own reference quantizers make of them.

The expected blocks come from ggml itself: ggml/src/ggml-quants.c (quantize_row_<type>_ref, the
non-imatrix path that llama-quantize, stable-diffusion.cpp's convert and ggml_quantize_chunk with
no importance matrix run) compiled here into a small shared library and called through ctypes.
It is built the way ggml's base library is: C11, -O2, baseline x86-64 (no -march: no FMA for the
compiler to contract into), asserts on. gguf-py (the `gguf` package) is checked against it where it
has a quantizer (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, BF16): two independent implementations agreeing.

Files written to tests/data/gguf/:
    quant_input.npy     float32 [ROWS, 512]: random rows and edge cases (all zeros, constants,
                        negative-only, positive-only, one spike, huge (1e5) and tiny (1e-7, fp16
                        subnormal scales; 1e-20, below ggml's GROUP_MAX_EPS) magnitudes, exact ties)
    quant_<TYPE>.npy    uint8 [ROWS, row bytes]: ggml's blocks of each row, for F32 F16 BF16 Q8_0
                        Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K

Usage (from the repository root; a ggml checkout anywhere outside the repository, e.g. from
github ggml-org/ggml, and a C compiler):
    /work/oracle/bin/python scripts/reference/make_gguf_quant_fixtures.py --ggml /path/to/ggml
Deterministic: a rerun gives identical files. The ggml commit used is printed (and recorded in
scripts/reference/README.md).
"""

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(REPO_ROOT, "tests", "data", "gguf")
COLS = 512

# ggml's ggml_abort and the three ggml.c helpers ggml-quants.c links to (used only by its
# quantize_<type> chunk functions, never by the _ref ones called here).
STUB = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort(); }
size_t ggml_row_size(int t, long n) { (void)t; (void)n; abort(); }
const char * ggml_type_name(int t) { (void)t; abort(); }
size_t ggml_type_size(int t) { (void)t; abort(); }
"""


def build_ggml(ggml_dir, tmp):
    stub = os.path.join(tmp, "stub.c")
    with open(stub, "w") as f:
        f.write(STUB)
    lib = os.path.join(tmp, "libggmlq.so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-fPIC", "-shared", "-std=gnu11", "-I", os.path.join(ggml_dir, "include"),
                    "-I", os.path.join(ggml_dir, "src"), os.path.join(ggml_dir, "src", "ggml-quants.c"), stub,
                    "-lm", "-o", lib], check=True)
    return ctypes.CDLL(lib)


def inputs():
    rng = np.random.default_rng(43)
    rows = []
    for scale in (1.0, 0.02, 3.0):
        rows.append(rng.standard_normal(COLS) * scale)
    rows.append(rng.uniform(-1, 1, COLS))
    rows.append(np.zeros(COLS))
    rows.append(np.full(COLS, 0.75))
    rows.append(np.full(COLS, -1.25))
    rows.append(-np.abs(rng.standard_normal(COLS)))           # negative only
    rows.append(np.abs(rng.standard_normal(COLS)) + 0.5)      # positive only, min > 0
    spike = rng.standard_normal(COLS) * 0.01
    spike[::37] = 40.0                                        # an outlier in some blocks
    rows.append(spike)
    rows.append(rng.standard_normal(COLS) * 1e5)              # huge: fp16 min of Q4_1 / Q5_1 overflows
    rows.append(rng.standard_normal(COLS) * 1e-7)             # tiny: subnormal fp16 scales
    rows.append(rng.standard_normal(COLS) * 1e-20)            # below GROUP_MAX_EPS
    rows.append(rng.integers(-8, 8, COLS).astype(np.float64))  # exact ties for the rounding
    mixed = rng.standard_normal(COLS)
    mixed[:256] *= 1e-3                                       # blocks of very different scale in one row
    rows.append(mixed)
    halfzero = rng.standard_normal(COLS)
    halfzero[::2] = 0.0
    rows.append(halfzero)
    return np.stack(rows).astype(np.float32)


# (type, ggml function, block elements, block bytes)
QTYPES = [
    (T.Q8_0, "quantize_row_q8_0_ref"), (T.Q4_0, "quantize_row_q4_0_ref"), (T.Q4_1, "quantize_row_q4_1_ref"),
    (T.Q5_0, "quantize_row_q5_0_ref"), (T.Q5_1, "quantize_row_q5_1_ref"), (T.Q2_K, "quantize_row_q2_K_ref"),
    (T.Q3_K, "quantize_row_q3_K_ref"), (T.Q4_K, "quantize_row_q4_K_ref"), (T.Q5_K, "quantize_row_q5_K_ref"),
    (T.Q6_K, "quantize_row_q6_K_ref"),
]


def ggml_quantize(lib, fn, qtype, x):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    out = np.zeros((x.shape[0], x.shape[1] // block * size), dtype=np.uint8)
    f = getattr(lib, fn)
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    f.restype = None
    for r in range(x.shape[0]):
        row = np.ascontiguousarray(x[r])
        f(row.ctypes.data, out[r].ctypes.data, row.size)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ggml", required=True, help="a ggml checkout (has src/ggml-quants.c)")
    args = ap.parse_args()
    try:
        commit = subprocess.run(["git", "-C", args.ggml, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    print("ggml:", commit or "(not a git checkout)", args.ggml)
    x = inputs()
    os.makedirs(OUT, exist_ok=True)
    np.save(os.path.join(OUT, "quant_input.npy"), x)
    with tempfile.TemporaryDirectory() as tmp:
        lib = build_ggml(args.ggml, tmp)
        for qtype, fn in QTYPES:
            blocks = ggml_quantize(lib, fn, qtype, x)
            if qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
                py = gguf.quants.quantize(x, qtype)
                if not np.array_equal(py, blocks):
                    bad = np.nonzero((py != blocks).any(axis=1))[0]
                    sys.exit(f"{qtype.name}: gguf-py and ggml disagree on rows {bad.tolist()}")
            np.save(os.path.join(OUT, f"quant_{qtype.name}.npy"), blocks)
            print(f"{qtype.name}: {blocks.shape}")
    np.save(os.path.join(OUT, "quant_F32.npy"), x.view(np.uint8).reshape(x.shape[0], -1))
    np.save(os.path.join(OUT, "quant_F16.npy"), x.astype(np.float16).view(np.uint8).reshape(x.shape[0], -1))
    np.save(os.path.join(OUT, "quant_BF16.npy"), gguf.quants.quantize(x, T.BF16).view(np.uint8).reshape(x.shape[0], -1))


if __name__ == "__main__":
    main()
