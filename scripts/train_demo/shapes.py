"""The demo model's synthetic world: coloured shapes on plain backgrounds, with captions.

One scene is one shape kind in one colour, drawn one to three times in a row across the picture
(centred for one), small, medium or big, on a plain background. Layouts are fixed per count with
a few pixels of jitter: that keeps the conditional distribution of a caption nearly unimodal, which
is what lets a model trained for an hour on two CPU cores give sharp pictures in 4 steps.

Pure Python + Pillow + numpy, no torch: the tests' prompt list (tests/data/demo/prompts.json) and
the analysis in tests/test_demo_model.cpp are written from the definitions here, never from model
outputs.
"""

import math
import random

import numpy as np
from PIL import Image, ImageDraw

RES = 128          # native size of the demo model (pixels, square)
SUPERSAMPLE = 4    # drawn at 4x and box-filtered down: anti-aliased edges like a real picture

# Foreground colours: distinct hues, so "the dominant foreground hue matches the prompt" is a
# well-posed check. Hue in degrees (HSV) beside each, for the tests.
COLOURS = {
    "red": (220, 30, 30),       # 0
    "orange": (245, 135, 20),   # ~30
    "yellow": (240, 220, 30),   # ~54
    "green": (40, 170, 60),     # ~130
    "blue": (35, 80, 220),      # ~225
    "purple": (140, 50, 200),   # ~275
}
BACKGROUNDS = {
    "white": (245, 245, 245),
    "black": (15, 15, 15),
    "gray": (128, 128, 128),
    **COLOURS,
}
SHAPES = ["circle", "square", "triangle", "star", "ring"]
COUNT_WORDS = {1: ["a", "one"], 2: ["two"], 3: ["three"]}
SIZES = ["small", "big"]  # None in a scene = medium, the caption says nothing

# Shape diameter as a fraction of the picture width, per count and size.
DIAMETER = {
    1: {"small": 0.28, None: 0.45, "big": 0.62},
    2: {"small": 0.18, None: 0.28, "big": 0.38},
    3: {"small": 0.14, None: 0.20, "big": 0.27},
}
CENTRES_X = {1: [0.5], 2: [0.3, 0.7], 3: [0.19, 0.5, 0.81]}


def plural(shape):
    return shape + "s"


def sample_scene(rng: random.Random):
    colour = rng.choice(list(COLOURS))
    bg = rng.choice([b for b in BACKGROUNDS if b != colour])
    return {
        "shape": rng.choice(SHAPES),
        "colour": colour,
        "count": rng.choice([1, 2, 3]),
        "size": rng.choice(["small", None, "big"]),
        "background": bg,
        # Most captions name the background; the rest leave it to chance (the model then picks one).
        "say_background": rng.random() < 0.8,
    }


def caption(scene, rng: random.Random):
    n, shape, colour, size = scene["count"], scene["shape"], scene["colour"], scene["size"]
    count = rng.choice(COUNT_WORDS[n])
    noun = shape if n == 1 else plural(shape)
    adj = f"{size} {colour}" if size else colour
    if n == 1 and count == "a" and adj[0] in "aeiou":
        count = "an"
    subject = f"{count} {adj} {noun}"
    if rng.random() < 0.15:
        subject = rng.choice(["a picture of ", "an image of ", "a drawing of "]) + subject
    if not scene["say_background"]:
        return subject
    bg = scene["background"]
    return rng.choice([
        f"{subject} on a {bg} background",
        f"{subject} on a {bg} background",
        f"{subject} on {bg}",
        f"{subject}, {bg} background",
    ])


def _polygon(cx, cy, r, points, inner=None, rotation=-math.pi / 2):
    verts = []
    steps = points * (2 if inner else 1)
    for i in range(steps):
        rr = r if (inner is None or i % 2 == 0) else r * inner
        a = rotation + 2 * math.pi * i / steps
        verts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return verts


def render(scene, rng: random.Random, res: int = RES) -> np.ndarray:
    """The scene as an RGB uint8 array [res, res, 3]."""
    s = res * SUPERSAMPLE
    bg = BACKGROUNDS[scene["background"]]
    img = Image.new("RGB", (s, s), bg)
    draw = ImageDraw.Draw(img)
    n = scene["count"]
    base = DIAMETER[n][scene["size"]]
    jitter = 0.03 * s
    fg = tuple(int(min(255, max(0, c + rng.randint(-12, 12)))) for c in COLOURS[scene["colour"]])
    for cx_frac in CENTRES_X[n]:
        d = base * s * rng.uniform(0.92, 1.08)
        r = d / 2
        cx = cx_frac * s + rng.uniform(-jitter, jitter)
        cy = 0.5 * s + rng.uniform(-jitter, jitter)
        shape = scene["shape"]
        if shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fg)
        elif shape == "ring":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fg)
            ri = r * 0.55
            draw.ellipse([cx - ri, cy - ri, cx + ri, cy + ri], fill=bg)
        elif shape == "square":
            h = r * 0.86  # same visual weight as a circle of diameter d
            draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fg)
        elif shape == "triangle":
            draw.polygon(_polygon(cx, cy + 0.15 * r, r * 1.1, 3), fill=fg)
        elif shape == "star":
            draw.polygon(_polygon(cx, cy + 0.05 * r, r * 1.05, 5, inner=0.45), fill=fg)
    img = img.resize((res, res), Image.BOX)
    return np.asarray(img, dtype=np.uint8)


# The tests' prompts. None of these strings is ever a training caption (train.py rejects them),
# and the combinations marked below never occur in training in any phrasing:
#   "orange ring" x three, "green star" x two, "purple triangle" x three.
TEST_PROMPTS = [
    ("a red circle on a white background", "red", "circle", 1),
    ("a big blue square on a white background", "blue", "square", 1),
    ("a yellow triangle on a black background", "yellow", "triangle", 1),
    ("a small green star on a white background", "green", "star", 1),
    ("a purple ring on a gray background", "purple", "ring", 1),
    ("an orange circle on a blue background", "orange", "circle", 1),
    ("one big red star on a black background", "red", "star", 1),
    ("a blue triangle on a yellow background", "blue", "triangle", 1),
    ("two yellow stars on a blue background", "yellow", "star", 2),
    ("two red squares on a white background", "red", "square", 2),
    ("two blue circles on a black background", "blue", "circle", 2),
    ("two big purple rings on a white background", "purple", "ring", 2),
    ("two green stars on a black background", "green", "star", 2),
    ("two orange triangles on a gray background", "orange", "triangle", 2),
    ("three green circles on a white background", "green", "circle", 3),
    ("three blue stars on a white background", "blue", "star", 3),
    ("three red triangles on a black background", "red", "triangle", 3),
    ("three yellow squares on a purple background", "yellow", "square", 3),
    ("three orange rings on a white background", "orange", "ring", 3),
    ("three purple triangles on a yellow background", "purple", "triangle", 3),
    ("a green square on a red background", "green", "square", 1),
    ("two small blue rings on a white background", "blue", "ring", 2),
    ("a big yellow circle on a black background", "yellow", "circle", 1),
    ("three big red rings on a gray background", "red", "ring", 3),
]
HELD_OUT_COMBOS = {("orange", "ring", 3), ("green", "star", 2), ("purple", "triangle", 3)}
TEST_STRINGS = {p for p, *_ in TEST_PROMPTS}


def training_scene(rng: random.Random):
    """(scene, caption) drawn from the training distribution: never a test prompt, never a
    held-out combination."""
    while True:
        scene = sample_scene(rng)
        if (scene["colour"], scene["shape"], scene["count"]) in HELD_OUT_COMBOS:
            continue
        text = caption(scene, rng)
        if text in TEST_STRINGS:
            continue
        return scene, text


def training_example(rng: random.Random):
    """(image uint8 [RES, RES, 3], caption) drawn from the training distribution."""
    scene, text = training_scene(rng)
    return render(scene, rng), text


if __name__ == "__main__":
    import argparse
    import os

    ap = argparse.ArgumentParser(description="write a few training examples as PNGs + captions")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    r = random.Random(a.seed)
    with open(os.path.join(a.out, "captions.txt"), "w") as f:
        for i in range(a.n):
            im, text = training_example(r)
            Image.fromarray(im).save(os.path.join(a.out, f"{i:03d}.png"))
            f.write(f"{i:03d}.png\t{text}\n")
