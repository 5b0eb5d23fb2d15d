#!/usr/bin/env python3
"""Reference runs of the shapes demo model (models/demo) with the REAL diffusers Flux2KleinPipeline
in float32, for klein.cpp's test that the demo model is "just another model" (tests/test_demo_reference.cpp):
every step's latents, the decoded image (float, before postprocessing) and the 8-bit picture.

Writes tests/data/ref_demo/<case>/{latents_step<k>,image,image_u8}.npy and manifest.json.

Run:  /path/to/oracle/bin/python scripts/reference/dump_demo_reference.py
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dump_reference as dr  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

MODEL = os.path.join(dr.REPO_ROOT, "models", "demo")
OUT = os.path.join(dr.REPO_ROOT, "tests", "data", "ref_demo")

CASES = [
    dict(name="stars_128", prompt="three blue stars on a white background", width=128, height=128, seed=0, steps=4),
    dict(name="circle_128", prompt="a red circle on a white background", width=128, height=128, seed=7, steps=4),
    dict(name="rings_96x160", prompt="two purple rings on a yellow background", width=160, height=96, seed=3, steps=8),
]


def run_case(pipe, case, w):
    W, H, N = case["width"], case["height"], case["steps"]
    rec = {"steps": []}

    def cb(p, i, t, kw):
        rec["steps"].append(kw["latents"].clone())
        return {}

    orig_decode = pipe.vae.decode

    def decode(z, *a, **k):
        out = orig_decode(z, *a, **k)
        rec["image"] = (out[0] if isinstance(out, tuple) else out.sample).clone()
        return out

    pipe.vae.decode = decode
    try:
        with torch.no_grad():
            pipe(prompt=case["prompt"], height=H, width=W, num_inference_steps=N,
                 generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np",
                 callback_on_step_end=cb, callback_on_step_end_tensor_inputs=["latents"])
    finally:
        del pipe.vae.decode
    h, wt = H // 16, W // 16
    assert len(rec["steps"]) == N
    for k, lat in enumerate(rec["steps"], start=1):
        w.save(f"latents_step{k}", lat.reshape(1, h, wt, -1).permute(0, 3, 1, 2))
    w.save("image", rec["image"])
    pil = pipe.image_processor.postprocess(rec["image"], output_type="pil")[0]
    w.save("image_u8", np.array(pil), np.uint8)


def main():
    torch.manual_seed(0)
    pipe = dr.load_pipeline(MODEL, torch.float32)
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for case in CASES:
        w = dr.CaseWriter(OUT, case["name"])
        run_case(pipe, case, w)
        cases.append(dict(case, dir=case["name"], files=w.files))
        print(f"[demo] {case['name']}")
    import diffusers
    manifest = dict(description="The shapes demo model (models/demo) through the real diffusers Flux2KleinPipeline "
                                "in float32 (scripts/reference/dump_demo_reference.py).",
                    versions=dict(torch=torch.__version__, diffusers=diffusers.__version__, numpy=np.__version__),
                    cases=cases)
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
