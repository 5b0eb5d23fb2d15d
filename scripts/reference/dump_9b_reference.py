#!/usr/bin/env python3
"""Reference tensors for the 9B family: the 9B-shaped tiny model with the REAL diffusers
Flux2KleinPipeline, and the KV-cached reference-editing variant (FLUX.2 klein 9B-KV) with the REAL
Flux2KleinKVPipeline, for klein.cpp's tests (tests/test_kv.cpp).

  tests/data/tiny_9b     text_encoder/ and transformer/ from make_tiny_model.py --variant 9b, the
                         tiny model's tokenizer, scheduler and VAE (symlinks to tests/data/tiny/*),
                         and a model_index.json (Flux2KleinPipeline): this script writes the last two
  tests/data/tiny_9b_kv  the same components (symlinks to tiny_9b/*) under a model_index.json whose
                         _class_name is "Flux2KleinKVPipeline". The KV checkpoints are their own
                         distill, but the pipeline's arithmetic does not depend on the weights, so
                         random ones test it as well as any.

For each case below it runs the pipeline in float32 on CPU and writes tests/data/ref_9b/<case>/*.npy
plus manifest.json:

  noise.npy               initial latents [1, 128, H/16, W/16] (randn_tensor, seeded)
  velocity_step<k>.npy    the transformer's velocity at step k, unpacked (an edit of the KV pipeline:
                          step 1 is the "extract" call, references first and their K/V cached,
                          later steps the "cached" calls)
  latents_step<k>.npy     latents after step k, unpacked [1, 128, H/16, W/16]
  latents_final.npy       the VAE decoder's input [1, 32, H/8, W/8]
  image.npy / image_u8.npy / image.png
  ref<i>.png              the reference images

Run:  /path/to/oracle/bin/python scripts/reference/make_tiny_model.py --variant 9b
      /path/to/oracle/bin/python scripts/reference/dump_9b_reference.py
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dump_reference as dr  # noqa: E402  (sets the offline / attention environment first)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import Flux2KleinKVPipeline, Flux2KleinPipeline  # noqa: E402
from PIL import Image  # noqa: E402

DATA = os.path.join(dr.REPO_ROOT, "tests", "data")
NINE = os.path.join(DATA, "tiny_9b")
KV_MODEL = os.path.join(DATA, "tiny_9b_kv")
OUT = os.path.join(DATA, "ref_9b")

NINE_CASES = [
    dict(name="9b_t2i", prompt=dr.CAT, width=64, height=48, steps=4, seed=42, refs=[]),
    dict(name="9b_edit", prompt=dr.CAT, width=None, height=None, steps=3, seed=7, refs=[(96, 64, 11)]),
]

KV_CASES = [
    # one reference, larger than the output
    dict(name="kv_1ref", prompt=dr.CAT, width=64, height=64, steps=3, seed=42, refs=[(96, 64, 11)]),
    # two references of different sizes, a non-square output
    dict(name="kv_2ref", prompt=dr.CAT, width=48, height=80, steps=3, seed=3, refs=[(64, 64, 12), (64, 96, 13)]),
    # four references (diffusers wants each side >= 64), the output takes the first reference's size
    dict(name="kv_4ref", prompt="two yellow stars", width=None, height=None, steps=2, seed=9,
         refs=[(80, 64, 21), (64, 64, 22), (64, 96, 23), (96, 80, 24)]),
    # no reference: the standard forward
    dict(name="kv_noref", prompt=dr.CAT, width=64, height=48, steps=2, seed=5, refs=[]),
]


def make_folder(dst, cls, links):
    """dst/model_index.json (the tiny model's, with pipeline class `cls`) and symlinks comp -> target."""
    with open(os.path.join(DATA, "tiny", "model_index.json")) as fh:
        index = json.load(fh)
    index["_class_name"] = cls
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "model_index.json"), "w") as fh:
        json.dump(index, fh, indent=2)
        fh.write("\n")
    for comp, target in links.items():
        link = os.path.join(dst, comp)
        if not os.path.islink(link):
            os.symlink(target, link)


def make_models():
    assert os.path.isdir(os.path.join(NINE, "transformer")), "run make_tiny_model.py --variant 9b first"
    make_folder(NINE, "Flux2KleinPipeline", {c: os.path.join("..", "tiny", c) for c in ("scheduler", "tokenizer", "vae")})
    make_folder(KV_MODEL, "Flux2KleinKVPipeline",
                {c: os.path.join("..", "tiny_9b", c)
                 for c in ("scheduler", "text_encoder", "tokenizer", "transformer", "vae")})


def unpack(pipe, packed, ids, h, w):
    """(1, h*w, C) tokens -> (1, C, h, w) with the KV pipeline's own unpacking (it reads h, w from the ids)."""
    out = pipe._unpack_latents_with_ids(packed, ids)
    assert tuple(out.shape[2:]) == (h, w), (tuple(out.shape), h, w)
    return out


def run_case(pipe, case, w, kv):
    W, H, N = case["width"], case["height"], case["steps"]
    refs = []
    for i, (rw, rh, rs) in enumerate(case["refs"]):
        im = dr.make_ref_image(rw, rh, rs)
        im.save(os.path.join(w.dir, f"ref{i}.png"))
        w.add_file(f"ref{i}.png", {"shape": [rh, rw, 3], "dtype": "uint8", "format": "png"})
        refs.append(Image.open(os.path.join(w.dir, f"ref{i}.png")))
    rec = {"steps": [], "velocity": [], "modes": [], "ref_tokens": 0}
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
        rec["velocity"].append(model_output.clone())
        return orig_step(model_output, *a, **k)

    def tr_hook(mod, args, kwargs, output):
        rec["modes"].append(kwargs.get("kv_cache_mode"))
        if kwargs.get("kv_cache_mode") == "extract":
            rec["ref_tokens"] = int(kwargs["num_ref_tokens"])

    def cb(p, i, t, kw):
        rec["steps"].append((i, float(t), kw["latents"].clone()))
        return {}

    pipe.prepare_latents = prepare_latents
    pipe.vae.decode = decode
    pipe.scheduler.step = step
    hd = pipe.transformer.register_forward_hook(tr_hook, with_kwargs=True)
    try:
        with torch.no_grad():
            images = pipe(image=refs or None, prompt=case["prompt"], height=H, width=W, num_inference_steps=N,
                          generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np",
                          callback_on_step_end=cb, callback_on_step_end_tensor_inputs=["latents"]).images
    finally:
        del pipe.prepare_latents
        del pipe.vae.decode
        del pipe.scheduler.step
        hd.remove()

    want = (["extract"] + ["cached"] * (N - 1)) if refs and kv else [None] * N
    assert rec["modes"] == want, rec["modes"]
    ids = rec["latent_ids"]
    H, W = int(images.shape[1]), int(images.shape[2])
    h, wt = H // 16, W // 16
    w.save("noise", unpack(pipe, rec["latents0"], ids, h, wt))
    assert len(rec["steps"]) == N and len(rec["velocity"]) == N
    for k, (i, t, lat) in enumerate(rec["steps"], start=1):
        w.save(f"latents_step{k}", unpack(pipe, lat, ids, h, wt))
        w.save(f"velocity_step{k}", unpack(pipe, rec["velocity"][k - 1], ids, h, wt))
    w.save("latents_final", rec["z"])
    w.save("image", rec["image"])
    pil = pipe.image_processor.postprocess(rec["image"], output_type="pil")[0]
    assert np.array_equal(pipe.image_processor.postprocess(rec["image"], output_type="np"), images)
    w.save("image_u8", np.array(pil), np.uint8)
    pil.save(os.path.join(w.dir, "image.png"))
    w.add_file("image.png", {"shape": [H, W, 3], "dtype": "uint8", "format": "png"})
    return dict(prompt=case["prompt"], width=W, height=H, width_arg=case["width"], height_arg=case["height"],
                num_inference_steps=N, seed=case["seed"], refs=["ref%d.png" % i for i in range(len(refs))],
                ref_tokens=rec["ref_tokens"], transformer_modes=[m or "plain" for m in rec["modes"]],
                dtype="float32", sigmas=[float(s) for s in pipe.scheduler.sigmas],
                timesteps=[t for (_, t, _) in rec["steps"]])


def main():
    make_models()
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for kind, cls, model, case_list in (("9b", Flux2KleinPipeline, NINE, NINE_CASES),
                                        ("kv", Flux2KleinKVPipeline, KV_MODEL, KV_CASES)):
        torch.manual_seed(0)
        pipe = cls.from_pretrained(model, dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        for m in (pipe.text_encoder, pipe.transformer, pipe.vae):
            m.eval()
        for case in case_list:
            w = dr.CaseWriter(OUT, case["name"])
            info = run_case(pipe, case, w, kind == "kv")
            entry = dict(name=case["name"], kind=kind, dir=case["name"],
                         model_dir=os.path.relpath(model, dr.REPO_ROOT))
            entry.update(info)
            entry["files"] = w.files
            cases.append(entry)
            print(f"[{kind}] {case['name']:10s} {len(w.files):3d} files, {info['ref_tokens']} reference tokens, "
                  f"{info['width']}x{info['height']}")
    import diffusers
    manifest = dict(description="9B-shaped and KV-cached reference-editing references for klein.cpp: the tiny "
                                "9B-shaped model (tests/data/tiny_9b) with the real diffusers Flux2KleinPipeline, and "
                                "under tests/data/tiny_9b_kv with the real Flux2KleinKVPipeline, in float32 "
                                "(scripts/reference/dump_9b_reference.py).",
                    versions=dict(torch=torch.__version__, diffusers=diffusers.__version__, numpy=np.__version__),
                    cases=cases)
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
