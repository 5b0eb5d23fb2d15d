#!/usr/bin/env python3
"""The same Python call through diffusers (bf16) and through klein, side by side.

    python bench/python_side_by_side.py MODEL_DIR [--size 256] [--steps 4] [--calls 2]
        [--diffusers-python PY] [--klein-python PY] [--threads N] [--precision fast|fp32]

MODEL_DIR is a diffusers folder of FLUX.2 [klein] (the full-size model, or its random-weight
copy from `klein-make_random_model`; tests/data/tiny for a smoke run). Each engine runs in its own
process (so each peak RSS is its own): it opens the pipeline, then makes --calls images of the same
request, seed 42. Printed per engine: open time, each call's time, and the process's peak RSS
(getrusage); then how close the two images are (klein.compare: PSNR, SSIM). The interpreters may
differ (--diffusers-python: one with torch + diffusers; --klein-python: one with the klein
package); by default both are this one. A benchmark, not a test: say the CPU and the load with
the numbers (bench/results.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

PROMPT = "A cat holding a sign that says hello world"

# Runs in the child process: argv = engine, model, size, steps, calls, threads, precision, out.npy
CHILD = r'''
import json, resource, sys, time
import numpy as np
engine, model, size, steps, calls, threads, precision, out = sys.argv[1:9]
size, steps, calls, threads = int(size), int(steps), int(calls), int(threads)
prompt = sys.argv[9]
t0 = time.perf_counter()
if engine == "diffusers":
    import torch
    from diffusers import Flux2KleinPipeline
    if threads:
        torch.set_num_threads(threads)
    pipe = Flux2KleinPipeline.from_pretrained(model, torch_dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    def call():
        g = torch.Generator("cpu").manual_seed(42)
        return pipe(prompt=prompt, height=size, width=size, num_inference_steps=steps, guidance_scale=1.0,
                    generator=g, output_type="np").images[0]
else:
    import klein
    pipe = klein.Flux2KleinPipeline.from_pretrained(model, threads=threads or None, precision=precision)
    pipe.set_progress_bar_config(disable=True)
    def call():
        return pipe(prompt=prompt, height=size, width=size, num_inference_steps=steps, guidance_scale=1.0,
                    generator=42, output_type="np").images[0]
open_s = time.perf_counter() - t0
times = []
for _ in range(calls):
    t = time.perf_counter()
    image = call()
    times.append(time.perf_counter() - t)
np.save(out, np.round(np.asarray(image, dtype=np.float32) * 255).astype(np.uint8))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
print(json.dumps({"open_s": open_s, "call_s": times, "peak_rss_gib": peak}))
'''


def run(engine: str, python: str, args: argparse.Namespace, out: str) -> Dict[str, Any]:
    cmd = [python, "-c", CHILD, engine, args.model, str(args.size), str(args.steps), str(args.calls),
           str(args.threads), args.precision, out, args.prompt]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{engine}: the run failed (exit {r.returncode}):\n{r.stderr.strip()[-2000:]}")
    result: Dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="diffusers folder of FLUX.2 [klein]")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--calls", type=int, default=2, help="images per engine (the first includes warm-up)")
    ap.add_argument("--threads", type=int, default=0, help="0: each engine's default (all cores)")
    ap.add_argument("--precision", default="fast", choices=["fast", "fp32"], help="klein's precision")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--diffusers-python", default=sys.executable)
    ap.add_argument("--klein-python", default=sys.executable)
    ap.add_argument("--engines", default="diffusers,klein")
    args = ap.parse_args()
    engines: List[str] = args.engines.split(",")
    results: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for e in engines:
            python = args.diffusers_python if e == "diffusers" else args.klein_python
            results[e] = run(e, python, args, os.path.join(tmp, e + ".npy"))
            r = results[e]
            calls = ", ".join(f"{t:.2f}" for t in r["call_s"])
            print(f"{e:10s} open {r['open_s']:6.2f} s   calls [{calls}] s   peak RSS {r['peak_rss_gib']:.2f} GiB")
        if len(engines) == 2:
            a, b = (os.path.join(tmp, e + ".npy") for e in engines)
            cmp = subprocess.run([args.klein_python, "-c",
                                  "import sys, numpy as np, klein; "
                                  "print(klein.compare(np.load(sys.argv[1]), np.load(sys.argv[2])))", a, b],
                                 capture_output=True, text=True)
            print(f"{engines[0]} vs {engines[1]} ({args.size}x{args.size}): "
                  f"{cmp.stdout.strip() or cmp.stderr.strip()}")

if __name__ == "__main__":
    main()
