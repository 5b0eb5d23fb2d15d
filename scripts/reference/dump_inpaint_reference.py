#!/usr/bin/env python3
"""Reference tensors for INPAINTING and IMAGE-TO-IMAGE, with the REAL diffusers
Flux2KleinInpaintPipeline (diffusers 0.42.1), for klein.cpp's tests (tests/test_inpaint.cpp).

Runs the pipeline in float32 on CPU on the tiny model (tests/data/tiny, distilled) and the tiny base
model (tests/data/tiny_base, classifier-free guidance; made by dump_base_reference.py) for each case
below and writes tests/data/ref_inpaint/<case>/ plus tests/data/ref_inpaint/manifest.json:

  source.png / mask.png / ref0.png   the inputs, as files (the pipeline reads them back with
                                     diffusers.utils.load_image, as a user would)
  noise.npy            the seeded noise [1, 128, H/16, W/16] (randn_tensor)
  image_latents.npy    the source image's normalised VAE latents [1, 128, H/16, W/16]
  init_latents.npy     the start: scheduler.scale_noise(image_latents, t_start, noise)
  mask.npy             prepare_mask_latents' token weights [1, H/16 * W/16, 1]
  velocity_step<k>.npy the (guided) velocity of step k, unpacked
  latents_step<k>.npy  latents after step k AND the blend with the re-noised source, unpacked
  latents_final.npy    the VAE decoder's input [1, 32, H/8, W/8]
  image.npy / image_u8.npy / image.png   the decoder output and the 8-bit picture

diffusers 0.42.1 has no klein image-to-image pipeline: klein.cpp's image-to-image (a source image and
no mask) is this pipeline with an all-white mask (everything repainted: the blend keeps the denoised
latents; the source still conditions every step as the first reference). The "img2img" case runs
exactly that.

Run:  /path/to/oracle/bin/python scripts/reference/dump_inpaint_reference.py
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dump_reference as dr  # noqa: E402  (sets the offline / attention environment first)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import Flux2KleinInpaintPipeline  # noqa: E402
from diffusers.utils import load_image  # noqa: E402
from PIL import Image  # noqa: E402

OUT = os.path.join(dr.REPO_ROOT, "tests", "data", "ref_inpaint")
TINY = os.path.join(dr.REPO_ROOT, "tests", "data", "tiny")
TINY_BASE = os.path.join(dr.REPO_ROOT, "tests", "data", "tiny_base")

# mask: (width, height, kind); kind "soft" = a grey disc with a soft (grey) edge, "color" = the same
# disc in orange (tests the grey-level conversion), "white" = all white (image-to-image).
CASES = [
    dict(name="inp_s06", model="tiny", source=(64, 64, 21), mask=(64, 64, "soft"), strength=0.6, steps=4, seed=42),
    # an odd source size (resized to 96x64, not cropped) and a mask of another size (resized to the image's)
    dict(name="inp_s03_odd", model="tiny", source=(100, 72, 22), mask=(50, 40, "soft"), strength=0.3, steps=5,
         seed=3),
    # strength 1: the start is pure noise; one reference image after the source
    dict(name="inp_s1_ref", model="tiny", source=(64, 48, 23), mask=(64, 48, "soft"), strength=1.0, steps=3, seed=7,
         ref=(80, 64, 24)),
    dict(name="img2img_s06", model="tiny", source=(64, 64, 25), mask=(64, 64, "white"), strength=0.6, steps=4, seed=9),
    dict(name="base_inp_g1", model="tiny_base", source=(64, 64, 26), mask=(64, 64, "soft"), strength=0.8, steps=4,
         seed=5, guidance=1.0),
    dict(name="base_inp_g4", model="tiny_base", source=(48, 80, 27), mask=(48, 80, "color"), strength=0.7, steps=4,
         seed=6, guidance=4.0),
]


def make_mask(width, height, kind):
    if kind == "white":
        return Image.new("RGB", (width, height), (255, 255, 255))
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    cx, cy, r = 0.55 * width, 0.45 * height, 0.3 * min(width, height)
    d = np.sqrt((x - cx) ** 2 + (y - cy) ** 2)
    m = np.clip((r - d) / (0.25 * r) + 0.5, 0, 1)  # soft edge: grey values over a quarter radius
    if kind == "soft":
        rgb = np.stack([m, m, m], axis=-1)
    else:
        rgb = np.stack([m, 0.55 * m, 0.1 * m], axis=-1)
    return Image.fromarray((rgb * 255).round().astype(np.uint8), "RGB")


def unpack(packed, h, w):
    """(1, h*w, C) tokens -> (1, C, h, w): the row-major ids of _prepare_latent_ids."""
    return packed.reshape(1, h, w, -1).permute(0, 3, 1, 2)


def run_case(pipe, case, w):
    N, g, s = case["steps"], case.get("guidance", 1.0), case["strength"]
    sw, sh, sseed = case["source"]
    dr.make_ref_image(sw, sh, sseed).save(os.path.join(w.dir, "source.png"))
    w.add_file("source.png", {"shape": [sh, sw, 3], "dtype": "uint8", "format": "png"})
    mw, mh, kind = case["mask"]
    make_mask(mw, mh, kind).save(os.path.join(w.dir, "mask.png"))
    w.add_file("mask.png", {"shape": [mh, mw, 3], "dtype": "uint8", "format": "png"})
    ref = None
    if "ref" in case:
        rw, rh, rseed = case["ref"]
        dr.make_ref_image(rw, rh, rseed).save(os.path.join(w.dir, "ref0.png"))
        w.add_file("ref0.png", {"shape": [rh, rw, 3], "dtype": "uint8", "format": "png"})
        ref = load_image(os.path.join(w.dir, "ref0.png"))
    source = load_image(os.path.join(w.dir, "source.png"))
    mask = load_image(os.path.join(w.dir, "mask.png"))

    rec = {"steps": [], "velocity": [], "calls": 0}
    orig_prepare, orig_mask = pipe.prepare_latents, pipe.prepare_mask_latents
    orig_decode, orig_step = pipe.vae.decode, pipe.scheduler.step

    def prepare_latents(*a, **k):
        out = orig_prepare(*a, **k)
        rec["latents0"], rec["noise"], rec["image_latents"] = out[0].clone(), out[1].clone(), out[2].clone()
        return out

    def prepare_mask_latents(*a, **k):
        out = orig_mask(*a, **k)
        rec["mask"] = out.clone()
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
        rec["calls"] += 1

    def cb(p, i, t, kw):
        rec["steps"].append((i, float(t), kw["latents"].clone()))
        return {}

    pipe.prepare_latents, pipe.prepare_mask_latents = prepare_latents, prepare_mask_latents
    pipe.vae.decode, pipe.scheduler.step = decode, step
    hd = pipe.transformer.register_forward_hook(tr_hook, with_kwargs=True)
    try:
        with torch.no_grad():
            images = pipe(prompt=dr.CAT, image=source, mask_image=mask, image_reference=ref, strength=s,
                          num_inference_steps=N, guidance_scale=g,
                          generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np",
                          callback_on_step_end=cb, callback_on_step_end_tensor_inputs=["latents"]).images
    finally:
        del pipe.prepare_latents, pipe.prepare_mask_latents, pipe.vae.decode, pipe.scheduler.step
        hd.remove()

    cfg = pipe.do_classifier_free_guidance
    run = len(rec["steps"])
    assert run >= 1 and len(rec["velocity"]) == run
    assert rec["calls"] == run * (2 if cfg else 1), rec["calls"]
    H, W = int(images.shape[1]), int(images.shape[2])
    h, wt = H // 16, W // 16
    w.save("noise", unpack(rec["noise"], h, wt))
    w.save("image_latents", unpack(rec["image_latents"], h, wt))
    w.save("init_latents", unpack(rec["latents0"], h, wt))
    w.save("mask", rec["mask"])
    for k, (i, t, lat) in enumerate(rec["steps"], start=1):
        w.save(f"latents_step{k}", unpack(lat, h, wt))
        w.save(f"velocity_step{k}", unpack(rec["velocity"][k - 1], h, wt))
    w.save("latents_final", rec["z"])
    w.save("image", rec["image"])
    pil = pipe.image_processor.postprocess(rec["image"], output_type="pil")[0]
    assert np.array_equal(pipe.image_processor.postprocess(rec["image"], output_type="np"), images)
    w.save("image_u8", np.array(pil), np.uint8)
    pil.save(os.path.join(w.dir, "image.png"))
    w.add_file("image.png", {"shape": [H, W, 3], "dtype": "uint8", "format": "png"})
    return dict(prompt=dr.CAT, model_dir="tests/data/" + case["model"], width=W, height=H,
                num_inference_steps=N, steps_run=run, strength=s, seed=case["seed"], guidance_scale=g, cfg=cfg,
                mask_kind=kind, transformer_calls=rec["calls"], refs=["ref0.png"] if ref is not None else [],
                dtype="float32", sigmas=[float(x) for x in pipe.scheduler.sigmas],
                timesteps=[t for (_, t, _) in rec["steps"]])


def main():
    assert os.path.isdir(TINY_BASE), "run dump_base_reference.py first (it makes tests/data/tiny_base)"
    torch.manual_seed(0)
    pipes = {}
    for name, path in (("tiny", TINY), ("tiny_base", TINY_BASE)):
        pipe = Flux2KleinInpaintPipeline.from_pretrained(path, dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        pipes[name] = pipe
    assert pipes["tiny"].config.is_distilled and not pipes["tiny_base"].config.is_distilled
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for case in CASES:
        w = dr.CaseWriter(OUT, case["name"])
        info = run_case(pipes[case["model"]], case, w)
        entry = dict(name=case["name"], kind="inpaint", dir=case["name"])
        entry.update(info)
        entry["files"] = w.files
        cases.append(entry)
        print(f"[inpaint] {case['name']:14s} {len(w.files):3d} files, {info['steps_run']} of "
              f"{info['num_inference_steps']} steps, {info['transformer_calls']} transformer calls")
    import diffusers
    manifest = dict(description="Inpainting / image-to-image references for klein.cpp, from the tiny models with the "
                                "real diffusers Flux2KleinInpaintPipeline in float32 "
                                "(scripts/reference/dump_inpaint_reference.py).",
                    versions=dict(torch=torch.__version__, diffusers=diffusers.__version__, numpy=np.__version__),
                    cases=cases)
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
