#!/usr/bin/env python3
"""Write tests/data/demo_check/: the demo model's test prompts with what each asks for, and the
scenes those prompts describe drawn by the dataset's renderer (ground truth for the test's image
analysis). Nothing here comes from a model: the expectations are the prompts' own words.

    python scripts/train_demo/write_test_data.py [--out tests/data/demo_check]
"""
import argparse
import json
import os
import random
import sys

from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shapes  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def background_of(prompt):
    for b in shapes.BACKGROUNDS:
        if f"on a {b} background" in prompt:
            return b
    raise ValueError(prompt)


def size_of(prompt):
    words = prompt.split()
    return "small" if "small" in words else "big" if "big" in words else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "tests", "data", "demo_check"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    rng = random.Random(1234)
    for i, (prompt, colour, shape, count) in enumerate(shapes.TEST_PROMPTS):
        bg = background_of(prompt)
        scene = {"shape": shape, "colour": colour, "count": count, "size": size_of(prompt),
                 "background": bg, "say_background": True}
        name = f"scene_{i:02d}.png"
        Image.fromarray(shapes.render(scene, rng)).save(os.path.join(a.out, name))
        rows.append({"prompt": prompt, "colour": colour, "shape": shape, "count": count,
                     "background": bg, "rendered": name,
                     "held_out_combo": (colour, shape, count) in shapes.HELD_OUT_COMBOS})
    doc = {
        "comment": "Demo-model test prompts (scripts/train_demo/shapes.py TEST_PROMPTS); none is a "
                   "training caption. 'rendered' is the dataset renderer's drawing of the scene.",
        "size": shapes.RES,
        "colour_rgb": shapes.COLOURS,
        "background_rgb": shapes.BACKGROUNDS,
        "prompts": rows,
    }
    with open(os.path.join(a.out, "prompts.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
