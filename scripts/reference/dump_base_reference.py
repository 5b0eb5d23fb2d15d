#!/usr/bin/env python3
"""Reference tensors for BASE (undistilled) models: classifier-free guidance, with the REAL diffusers
Flux2KleinPipeline, for klein.cpp's tests (tests/test_session.cpp).

The tiny base model is tests/data/tiny_base: the tiny model's components (symlinks to
tests/data/tiny/*) under a model_index.json with "is_distilled": false. This script (re)creates
that folder, then runs the pipeline in float32 on CPU for each case below and writes
tests/data/ref_base/<case>/*.npy plus tests/data/ref_base/manifest.json:

  noise.npy                 initial latents [1, 128, H/16, W/16] (randn_tensor, seeded)
  velocity_step<k>.npy      the GUIDED velocity of step k (what scheduler.step receives), unpacked
  latents_step<k>.npy       latents after step k, unpacked [1, 128, H/16, W/16]
  latents_final.npy         the VAE decoder's input [1, 32, H/8, W/8]
  image.npy / image_u8.npy / image.png   the decoder output [1, 3, H, W] and the 8-bit picture
  negative_prompt_embeds.npy (only for a case with its own negative prompt; the default "" gives
                            tests/data/ref/te_empty/prompt_embeds.npy, which the script checks)
  ref0.png                  the reference image (editing cases)

diffusers hard-codes the negative prompt "" (pipeline_flux2_klein.py: `negative_prompt = ""`);
a case with "negative" passes `negative_prompt_embeds` = pipe.encode_prompt(negative), which is what
klein's --negative-prompt computes.

Run:  /path/to/oracle/bin/python scripts/reference/dump_base_reference.py
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dump_reference as dr  # noqa: E402  (sets the offline / attention environment first)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

BASE_MODEL = os.path.join(dr.REPO_ROOT, "tests", "data", "tiny_base")
OUT = os.path.join(dr.REPO_ROOT, "tests", "data", "ref_base")

CASES = [
    # guidance 1.0 on a base model: do_classifier_free_guidance is false, one call per step
    dict(name="base_g1_64x64", prompt=dr.CAT, width=64, height=64, steps=3, seed=42, guidance=1.0),
    dict(name="base_g4_64x64", prompt=dr.CAT, width=64, height=64, steps=3, seed=42, guidance=4.0),
    # an odd (non-square) size and more steps
    dict(name="base_g75_48x80", prompt=dr.CAT, width=48, height=80, steps=5, seed=3, guidance=7.5),
    # editing with one reference (the output takes its size)
    dict(name="base_edit_g4", prompt=dr.CAT, width=None, height=None, steps=3, seed=7, guidance=4.0,
         refs=[(96, 64, 11)]),
    # a negative prompt of its own (negative_prompt_embeds)
    dict(name="base_neg_g4", prompt=dr.CAT, width=64, height=48, steps=2, seed=5, guidance=4.0,
         negative="blurry, low quality"),
]


def make_base_model():
    """tests/data/tiny_base: symlinks to the tiny model's components, is_distilled false."""
    tiny = os.path.join(dr.REPO_ROOT, "tests", "data", "tiny")
    os.makedirs(BASE_MODEL, exist_ok=True)
    with open(os.path.join(tiny, "model_index.json")) as fh:
        index = json.load(fh)
    index["is_distilled"] = False
    with open(os.path.join(BASE_MODEL, "model_index.json"), "w") as fh:
        json.dump(index, fh, indent=2)
        fh.write("\n")
    for comp in ("scheduler", "text_encoder", "tokenizer", "transformer", "vae"):
        link = os.path.join(BASE_MODEL, comp)
        if not os.path.islink(link):
            os.symlink(os.path.join("..", "tiny", comp), link)


def run_case(pipe, case, w):
    W, H, N, g = case["width"], case["height"], case["steps"], case["guidance"]
    refs = []
    for i, (rw, rh, rs) in enumerate(case.get("refs", [])):
        im = dr.make_ref_image(rw, rh, rs)
        im.save(os.path.join(w.dir, f"ref{i}.png"))
        w.add_file(f"ref{i}.png", {"shape": [rh, rw, 3], "dtype": "uint8", "format": "png"})
        refs.append(Image.open(os.path.join(w.dir, f"ref{i}.png")))
    rec = {"steps": [], "velocity": [], "calls": 0}
    orig_prepare = pipe.prepare_latents
    orig_decode = pipe.vae.decode
    orig_step = pipe.scheduler.step

    def prepare_latents(*a, **k):
        out = orig_prepare(*a, **k)
        rec["latents0"] = out[0].clone()
        rec["latent_ids"] = out[1].clone()
        return out

    def decode(z, *a, **k):
        out = orig_decode(z, *a, **k)
        rec["z"] = z.clone()
        rec["image"] = (out[0] if isinstance(out, tuple) else out.sample).clone()
        return out

    def step(model_output, *a, **k):
        rec["velocity"].append(model_output.clone())  # the guided velocity
        return orig_step(model_output, *a, **k)

    def tr_hook(mod, args, kwargs, output):
        rec["calls"] += 1

    def cb(p, i, t, kw):
        rec["steps"].append((i, float(t), kw["latents"].clone()))
        return {}

    neg_embeds = None
    if case.get("negative") is not None:
        with torch.no_grad():
            neg_embeds, _ = pipe.encode_prompt(prompt=case["negative"], device=torch.device("cpu"),
                                               max_sequence_length=512, text_encoder_out_layers=dr.TE_LAYERS)
        w.save("negative_prompt_embeds", neg_embeds)
    pipe.prepare_latents = prepare_latents
    pipe.vae.decode = decode
    pipe.scheduler.step = step
    hd = pipe.transformer.register_forward_hook(tr_hook, with_kwargs=True)
    try:
        with torch.no_grad():
            images = pipe(image=refs or None, prompt=case["prompt"], height=H, width=W, num_inference_steps=N,
                          guidance_scale=g, negative_prompt_embeds=neg_embeds,
                          generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np",
                          callback_on_step_end=cb, callback_on_step_end_tensor_inputs=["latents"]).images
    finally:
        del pipe.prepare_latents
        del pipe.vae.decode
        del pipe.scheduler.step
        hd.remove()

    cfg = g > 1.0
    assert pipe.do_classifier_free_guidance == cfg
    assert rec["calls"] == N * (2 if cfg else 1), rec["calls"]
    ids = rec["latent_ids"]
    H, W = int(images.shape[1]), int(images.shape[2])
    h, wt = H // 16, W // 16
    w.save("noise", dr.unpack(pipe, rec["latents0"], ids, h, wt))
    assert len(rec["steps"]) == N and len(rec["velocity"]) == N
    for k, (i, t, lat) in enumerate(rec["steps"], start=1):
        w.save(f"latents_step{k}", dr.unpack(pipe, lat, ids, h, wt))
        w.save(f"velocity_step{k}", dr.unpack(pipe, rec["velocity"][k - 1], ids, h, wt))
    w.save("latents_final", rec["z"])
    w.save("image", rec["image"])
    pil = pipe.image_processor.postprocess(rec["image"], output_type="pil")[0]
    assert np.array_equal(pipe.image_processor.postprocess(rec["image"], output_type="np"), images)
    w.save("image_u8", np.array(pil), np.uint8)
    pil.save(os.path.join(w.dir, "image.png"))
    w.add_file("image.png", {"shape": [H, W, 3], "dtype": "uint8", "format": "png"})
    if cfg and case.get("negative") is None:  # the default negative prompt "" is te_empty's
        with torch.no_grad():
            neg, _ = pipe.encode_prompt(prompt="", device=torch.device("cpu"), max_sequence_length=512,
                                        text_encoder_out_layers=dr.TE_LAYERS)
        ref = np.load(os.path.join(dr.DEFAULT_OUT, "te_empty", "prompt_embeds.npy"))
        d = float(np.abs(neg.numpy() - ref).max())
        print(f"  negative '' vs ref/te_empty: max abs diff {d:.3g} (max abs {np.abs(ref).max():.3g})")
        assert d <= 1e-5 * np.abs(ref).max(), "negative embeddings of '' differ from ref/te_empty"
    return dict(prompt=case["prompt"], negative_prompt=case.get("negative", ""), width=W, height=H,
                width_arg=case["width"], height_arg=case["height"], num_inference_steps=N, seed=case["seed"],
                guidance_scale=g, cfg=cfg, transformer_calls=rec["calls"],
                refs=["ref%d.png" % i for i in range(len(refs))], dtype="float32",
                sigmas=[float(s) for s in pipe.scheduler.sigmas],
                timesteps=[t for (_, t, _) in rec["steps"]])


def main():
    make_base_model()
    torch.manual_seed(0)
    pipe = dr.load_pipeline(BASE_MODEL, torch.float32)
    assert not pipe.config.is_distilled
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for case in CASES:
        w = dr.CaseWriter(OUT, case["name"])
        info = run_case(pipe, case, w)
        entry = dict(name=case["name"], kind="base", dir=case["name"])
        entry.update(info)
        entry["files"] = w.files
        cases.append(entry)
        print(f"[base] {case['name']:18s} {len(w.files):3d} files, {info['transformer_calls']} transformer calls")
    import diffusers
    manifest = dict(description="Base-model (classifier-free guidance) references for klein.cpp, from the tiny base "
                                "model tests/data/tiny_base with the real diffusers Flux2KleinPipeline in float32 "
                                "(scripts/reference/dump_base_reference.py).",
                    model_dir="tests/data/tiny_base",
                    versions=dict(torch=torch.__version__, diffusers=diffusers.__version__, numpy=np.__version__),
                    cases=cases)
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
