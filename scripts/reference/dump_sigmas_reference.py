#!/usr/bin/env python3
"""Reference tensors for custom SIGMAS and a static SHIFT, with the REAL diffusers Flux2KleinPipeline
(diffusers 0.42.1) on the tiny model, for klein.cpp's tests (tests/test_inpaint.cpp, "Schedule").

  sigmas: pipe(..., sigmas=S, num_inference_steps=len(S)): the scheduler shifts the given sigmas
          with mu = compute_empirical_mu(seq_len, len(S)) (use_dynamic_shifting, as klein's config).
  shift:  the scheduler rebuilt from its config with use_dynamic_shifting=False and shift=S (a static
          shift, shift*t / (1 + (shift-1)*t), in place of the resolution-dependent mu).

Writes tests/data/ref_sigmas/<case>/{noise,latents_step<k>,image}.npy + image_u8.npy and a
manifest.json with the sigmas and timesteps the scheduler made.

Run:  /path/to/oracle/bin/python scripts/reference/dump_sigmas_reference.py
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dump_reference as dr  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import FlowMatchEulerDiscreteScheduler  # noqa: E402

OUT = os.path.join(dr.REPO_ROOT, "tests", "data", "ref_sigmas")

CASES = [
    dict(name="sigmas3_64", width=64, height=64, seed=42, sigmas=[1.0, 0.6, 0.25]),
    dict(name="shift2_48x64", width=48, height=64, seed=5, steps=4, shift=2.0),
    dict(name="shift_sigmas", width=64, height=48, seed=8, sigmas=[0.9, 0.5, 0.3, 0.1], shift=3.0),
]


def run_case(pipe, case, w):
    W, H = case["width"], case["height"]
    sigmas = case.get("sigmas")
    N = len(sigmas) if sigmas else case["steps"]
    orig_sched = pipe.scheduler
    if "shift" in case:
        pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(orig_sched.config, use_dynamic_shifting=False,
                                                                     shift=case["shift"])
    rec = {"steps": []}

    def cb(p, i, t, kw):
        rec["steps"].append((i, float(t), kw["latents"].clone()))
        return {}

    orig_decode = pipe.vae.decode

    def decode(z, *a, **k):
        out = orig_decode(z, *a, **k)
        rec["image"] = (out[0] if isinstance(out, tuple) else out.sample).clone()
        return out

    pipe.vae.decode = decode
    try:
        with torch.no_grad():
            images = pipe(prompt=dr.CAT, height=H, width=W, num_inference_steps=N, sigmas=sigmas, guidance_scale=1.0,
                          generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np",
                          callback_on_step_end=cb, callback_on_step_end_tensor_inputs=["latents"]).images
        sched_sigmas = [float(s) for s in pipe.scheduler.sigmas]
    finally:
        del pipe.vae.decode
        pipe.scheduler = orig_sched
    h, wt = H // 16, W // 16
    assert len(rec["steps"]) == N
    for k, (i, t, lat) in enumerate(rec["steps"], start=1):
        w.save(f"latents_step{k}", lat.reshape(1, h, wt, -1).permute(0, 3, 1, 2))
    w.save("image", rec["image"])
    pil = pipe.image_processor.postprocess(rec["image"], output_type="pil")[0]
    w.save("image_u8", np.array(pil), np.uint8)
    return dict(prompt=dr.CAT, width=W, height=H, seed=case["seed"], steps=N, sigmas_arg=sigmas,
                shift=case.get("shift"), sigmas=sched_sigmas, timesteps=[t for (_, t, _) in rec["steps"]])


def main():
    torch.manual_seed(0)
    pipe = dr.load_pipeline(dr.DEFAULT_MODEL, torch.float32)
    assert pipe.scheduler.config.use_dynamic_shifting
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for case in CASES:
        w = dr.CaseWriter(OUT, case["name"])
        info = run_case(pipe, case, w)
        entry = dict(name=case["name"], dir=case["name"])
        entry.update(info)
        entry["files"] = w.files
        cases.append(entry)
        print(f"[sigmas] {case['name']:14s} sigmas {['%.6f' % s for s in info['sigmas']]}")
    import diffusers
    manifest = dict(description="Custom sigmas / static shift references for klein.cpp from the tiny model with the "
                                "real diffusers Flux2KleinPipeline in float32 "
                                "(scripts/reference/dump_sigmas_reference.py).",
                    versions=dict(torch=torch.__version__, diffusers=diffusers.__version__, numpy=np.__version__),
                    cases=cases)
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
