#!/usr/bin/env python3
"""Regenerate docs/demo/: what the shapes demo model draws, through klein.

  - readme.png: the README's first command, run exactly (prompt and options read from README.md);
  - grid_fp32.png, grid_q8.png, grid_q4.png: the grid prompts (scripts/train_demo/shapes.py's test
    prompts, two seeds each) under --precision fp32 (float32 weights path) and through
    `klein quantize --type q8 / q4` folders under the default --precision fast;
  - results.json: PSNR of every q8 / q4 picture against the fp32 one, and the means.

    python scripts/train_demo/make_docs.py [--klein build/klein]

Pictures come from klein; nothing here feeds the tests (their expectations are the prompts' words).
"""
import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shapes  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "models", "demo")
OUT = os.path.join(REPO, "docs", "demo")
SEEDS = (0, 1)


def run(cmd):
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return r


def readme_command():
    """The `./build/klein generate ...` part of README's first sh block."""
    text = open(os.path.join(REPO, "README.md")).read()
    block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    gen = block[block.index("./build/klein generate"):].strip()
    return shlex.split(gen)


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def grid(tiles, cols, path):
    rows = (len(tiles) + cols - 1) // cols
    g = Image.new("RGB", (shapes.RES * cols, shapes.RES * rows), (255, 255, 255))
    for i, t in enumerate(tiles):
        g.paste(Image.fromarray(t), ((i % cols) * shapes.RES, (i // cols) * shapes.RES))
    g.save(path, optimize=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--klein", default=os.path.join(REPO, "build", "klein"))
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)

    cmd = readme_command()
    cmd[0] = a.klein
    out_i = cmd.index("-o") + 1
    cmd[out_i] = os.path.join(OUT, "readme.png")
    run(cmd)

    prompts = [p for p, *_ in shapes.TEST_PROMPTS]
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"fp32": (MODEL, ["--precision", "fp32"])}
        for q in ("q8", "q4"):
            d = os.path.join(tmp, q)
            run([a.klein, "quantize", "--model", MODEL, "--type", q, "-o", d])
            variants[q] = (d, [])
        pics = {}
        for name, (model, extra) in variants.items():
            # One process per variant: the prompts go through --prompt-file one at a time.
            tiles = []
            for s in SEEDS:
                for i, p in enumerate(prompts):
                    png = os.path.join(tmp, f"{name}_{s}_{i}.png")
                    run([a.klein, "generate", "--model", model, "--prompt", p, "--seed", str(s), "-o", png, *extra])
                    tiles.append(np.asarray(Image.open(png).convert("RGB")))
            pics[name] = tiles
            grid(tiles, 8, os.path.join(OUT, f"grid_{name}.png"))
    res = {"prompts": prompts, "seeds": list(SEEDS), "psnr_vs_fp32": {}}
    for q in ("q8", "q4"):
        vals = [psnr(x, y) for x, y in zip(pics[q], pics["fp32"])]
        finite = [v for v in vals if math.isfinite(v)]
        res["psnr_vs_fp32"][q] = {"per_image": vals, "mean": sum(finite) / max(1, len(finite)),
                                  "min": min(vals), "identical": len(vals) - len(finite)}
        print(f"{q}: PSNR vs fp32 mean {res['psnr_vs_fp32'][q]['mean']:.2f} dB, min {min(vals):.2f} dB")
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
