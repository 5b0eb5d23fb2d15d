#!/usr/bin/env python3
"""PyTorch's own linear layers on the DiT's GEMM shapes, for comparison with klein-bench_kernels.

Runs in the pinned oracle venv (scripts/reference/requirements.txt), never in CI:
    python bench/pytorch_gemm.py [--threads 2] [--m 256 1024] [--dtype fp32 bf16] [--reps 3]

One line per (dtype, shape): GFLOP/s of torch.nn.functional.linear(x [M, K], w [N, K]) by wall
time, best of --reps after one warm-up call; the same shapes as klein-bench_kernels' GEMM rows
(K = 3072 into N = 3072 / 9216 / 18432, K = 9216 and 12288 into N = 3072). Divide by the
machine's peaks that klein-bench_kernels prints to get PyTorch's % of peak.
"""

import argparse
import time

import torch

SHAPES = ((3072, 3072), (3072, 9216), (3072, 18432), (9216, 3072), (12288, 3072))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--m", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--dtype", choices=["fp32", "bf16"], nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"# torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{a.threads} threads")
    types = {"fp32": torch.float32, "bf16": torch.bfloat16}
    g = torch.Generator().manual_seed(0)
    for name in a.dtype:
        dt = types[name]
        for m in a.m:
            for k, n in SHAPES:
                x = torch.randn(m, k, generator=g).to(dt)
                w = torch.randn(n, k, generator=g).to(dt)
                torch.nn.functional.linear(x, w)  # warm-up (oneDNN primitive creation)
                best = float("inf")
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    torch.nn.functional.linear(x, w)
                    best = min(best, time.perf_counter() - t0)
                print(f"torch linear {name} M={m} K={k} N={n}  {best * 1e3:9.2f} ms  "
                      f"{2.0 * m * k * n / best / 1e9:8.1f} GFLOP/s")


if __name__ == "__main__":
    main()
