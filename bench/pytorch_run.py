#!/usr/bin/env python3
"""One PyTorch/diffusers Flux2KleinPipeline run with per-phase times, for bench/vs_pytorch.sh.

Runs in the pinned oracle venv (scripts/reference/requirements.txt), never in CI:
    python bench/pytorch_run.py --model DIR -W 256 -H 256 [--steps 4] [--seed 42] [--threads 2]
        [--dtype bf16|fp32] [--ref IMG.png] [-o out.png]

Prints one line per phase, in the same words klein prints with --verbose, so the shell script
parses both engines alike:
    load 12.3            from_pretrained of all components (s)
    encode 6.1           text encoder call(s) inside the pipeline (s)
    vae_encode 0.8       reference image encoding (editing only)
    step 6.5             one line per transformer forward (s)
    decode 0.9           VAE decode (s)
    call 40.2            the whole pipeline call (s)
    maxrss_gib 16.0      peak resident set of this process
"""

import argparse
import os
import resource
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from diffusers import Flux2KleinPipeline  # noqa: E402
from PIL import Image  # noqa: E402


def timed_method(obj, name, label, log):
    """Wraps obj.name so each call prints `label seconds` (synchronous CPU work, so wall = cost)."""
    inner = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = inner(*args, **kwargs)
        log(label, time.perf_counter() - t0)
        return out

    setattr(obj, name, wrapper)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("-W", "--width", type=int, default=256)
    ap.add_argument("-H", "--height", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--prompt", default="a photo of a cat on a red sofa")
    ap.add_argument("--ref", action="append", default=[], help="reference image (editing); repeatable")
    ap.add_argument("-o", "--out", default=None)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)

    def log(label, seconds):
        print(f"{label} {seconds:.3f}", flush=True)

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    t0 = time.perf_counter()
    pipe = Flux2KleinPipeline.from_pretrained(a.model, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    log("load", time.perf_counter() - t0)

    # Phase boundaries: the text encoder's forward (prompt encoding), every transformer forward
    # (one per step, no CFG), and the VAE's encode/decode.
    timed_method(pipe.text_encoder, "forward", "encode", log)
    timed_method(pipe.transformer, "forward", "step", log)
    timed_method(pipe.vae, "decode", "decode", log)
    timed_method(pipe.vae, "encode", "vae_encode", log)

    refs = [Image.open(p).convert("RGB") for p in a.ref]
    kwargs = dict(prompt=a.prompt, height=a.height, width=a.width, num_inference_steps=a.steps,
                  generator=torch.Generator("cpu").manual_seed(a.seed))
    if refs:
        kwargs["image"] = refs if len(refs) > 1 else refs[0]
    t0 = time.perf_counter()
    with torch.inference_mode():
        image = pipe(**kwargs).images[0]
    log("call", time.perf_counter() - t0)
    if a.out:
        image.save(a.out)
    # ru_maxrss is in KiB on Linux.
    print(f"maxrss_gib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1048576:.2f}", flush=True)
    print(f"torch {torch.__version__} threads {torch.get_num_threads()} "
          f"cpu_capability {torch.backends.cpu.get_cpu_capability()}", file=sys.stderr)


if __name__ == "__main__":
    main()
