#!/usr/bin/env python3
"""Dump reference tensors from the tiny FLUX.2 [klein] pipeline (tests/data/tiny) with the REAL
diffusers / transformers code, for the C++ engine's tests.

Output: tests/data/ref/<case dir>/<tensor>.npy plus tests/data/ref/manifest.json.
All float tensors are saved as float32 (bf16 results are upcast exactly); ids/masks as int64;
the 8-bit image as uint8. Layouts are documented in scripts/reference/README.md and, per file,
in manifest.json ("files": name -> shape/dtype).

To add a case, append a dict to CASES below (see the existing ones for the keys each kind takes)
and rerun:   python scripts/reference/dump_reference.py
Run only some cases:   python scripts/reference/dump_reference.py --only te_cat dit_64x64
(with --only the manifest is updated in place for those cases).
"""

import argparse
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("DIFFUSERS_ATTN_BACKEND", "native")  # the default: torch SDPA

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
import torch  # noqa: E402

import diffusers  # noqa: E402
import transformers  # noqa: E402
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline  # noqa: E402
from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu, retrieve_timesteps  # noqa: E402
from diffusers.utils.torch_utils import randn_tensor  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_MODEL = os.path.join(REPO_ROOT, "tests", "data", "tiny")
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "data", "ref")

CAT = "A cat holding a sign that says hello world"
LONG = (
    "A highly detailed photograph of a busy medieval market square at dawn, with merchants "
    "arranging baskets of red apples, golden pears and purple grapes on wooden stalls, while "
    "a blacksmith hammers glowing iron beside a stone fountain. "
) * 16 + "THE END OF THE PROMPT IS NEVER SEEN"
UNICODE = "Un café à Zürich — naïve résumé; 東京の夜景と猫 🐱🎉 你好，世界！ Ünïcödé ñ ß ½ ﬁ"

# --------------------------------------------------------------------------------------------
# Cases. "name" is the output directory under tests/data/ref/. Add cases here.
# kinds: text_encoder | transformer | vae_decode | vae_encode | vae_bn | scheduler | noise | t2i
# --------------------------------------------------------------------------------------------
CASES = [
    # a. text encoder (fp32 pipeline; plus prompt_embeds from a bf16 pipeline)
    dict(kind="text_encoder", name="te_cat", prompt=CAT, extra_hidden=[0, 1]),
    dict(kind="text_encoder", name="te_empty", prompt=""),
    dict(kind="text_encoder", name="te_long", prompt=LONG),
    dict(kind="text_encoder", name="te_unicode", prompt=UNICODE),
    # b. transformer single forward, fp32 (+ output of the bf16 transformer on bf16-rounded inputs)
    #    width/height in pixels; tokens = (height//16) x (width//16)
    dict(kind="transformer", name="dit_64x64", width=64, height=64, timestep=0.75, seed=1001,
         prompt_case="te_cat", hooks=True, bf16=True),
    dict(kind="transformer", name="dit_80x48", width=80, height=48, timestep=0.3125, seed=1002,
         prompt_case="te_cat", hooks=True, bf16=True),
    # c. VAE decode fp32: z is (1, 32, height//8, width//8)
    dict(kind="vae_decode", name="vae_64x64", width=64, height=64, seed=2001, hooks=False),
    dict(kind="vae_decode", name="vae_80x48", width=80, height=48, seed=2002, hooks=False),
    dict(kind="vae_decode", name="vae_32x32", width=32, height=32, seed=2003, hooks=True),
    dict(kind="vae_encode", name="vae_enc_64x64", width=64, height=64, seed=2004),
    dict(kind="vae_bn", name="vae_bn"),
    # d. scheduler (sizes are W x H)
    dict(kind="scheduler", name="sched", steps=list(range(1, 9)),
         sizes=[(256, 256), (512, 512), (1024, 1024), (1360, 768), (1088, 1088)]),
    # e. noise, exactly as diffusers.utils.torch_utils.randn_tensor draws it with a CPU generator
    dict(kind="noise", name="noise", seeds=[0, 1, 42, 12345],
         shapes=[(1, 128, 4, 4), (1, 128, 3, 5), (1, 128, 16, 16)]),
    # f. full text-to-image
    dict(kind="t2i", name="t2i_64x64", prompt=CAT, width=64, height=64, steps=4, seed=42, dtype="float32",
         prompt_case="te_cat"),
    dict(kind="t2i", name="t2i_48x80", prompt=CAT, width=48, height=80, steps=4, seed=42, dtype="float32",
         prompt_case="te_cat"),
    dict(kind="t2i", name="t2i_64x64_bf16", prompt=CAT, width=64, height=64, steps=4, seed=42, dtype="bfloat16",
         prompt_case="te_cat"),
    # g. editing: reference images (procedural PNGs, saved as ref<i>.png in the case folder) given as
    #    image=[...]; W/H None -> the output takes the first reference's processed size.
    #    refs: (width, height, seed) of each generated image; 100x70 is centre-cropped to 96x64.
    dict(kind="t2i", name="edit1_auto", prompt=CAT, width=None, height=None, steps=4, seed=7, dtype="float32",
         prompt_case="te_cat", refs=[(100, 70, 11)]),
    dict(kind="t2i", name="edit3_64x48", prompt=CAT, width=64, height=48, steps=4, seed=8, dtype="float32",
         prompt_case="te_cat", refs=[(100, 70, 11), (64, 96, 12), (80, 80, 13)]),
    dict(kind="t2i", name="edit3_auto", prompt=CAT, width=None, height=None, steps=4, seed=9, dtype="float32",
         prompt_case="te_cat", refs=[(64, 96, 12), (100, 70, 11), (80, 80, 13)]),
]


def make_ref_image(width, height, seed):
    """A smooth, deterministic RGB test picture (gradients + a few blobs + mild noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    img = np.zeros((height, width, 3))
    for c in range(3):
        fx, fy, ph = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 6.28)
        img[..., c] = 0.5 + 0.35 * np.sin(2 * np.pi * (fx * x / width + fy * y / height) + ph)
    for _ in range(3):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(6, 20)
        img += (np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))[..., None] * rng.uniform(-0.4, 0.4, 3))
    img += rng.normal(0, 0.03, img.shape)
    return Image.fromarray((np.clip(img, 0, 1) * 255).round().astype(np.uint8), "RGB")

TE_LAYERS = (9, 18, 27)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
class CaseWriter:
    def __init__(self, out_root, name):
        self.dir = os.path.join(out_root, name)
        if os.path.exists(self.dir):
            shutil.rmtree(self.dir)
        os.makedirs(self.dir)
        self.files = {}

    def save(self, fname, x, dtype=None):
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            if x.dtype in (torch.bfloat16, torch.float16):
                x = x.float()
            x = x.numpy()
        x = np.asarray(x)
        if dtype is not None:
            x = x.astype(dtype)
        elif x.dtype == np.float64:
            x = x.astype(np.float32)
        if np.issubdtype(x.dtype, np.floating):
            assert np.all(np.isfinite(x)), f"{self.dir}/{fname} has non-finite values"
        path = os.path.join(self.dir, fname + ".npy")
        np.save(path, np.ascontiguousarray(x))
        self.files[fname + ".npy"] = {"shape": list(x.shape), "dtype": str(x.dtype)}
        return x

    def add_file(self, fname, desc):
        self.files[fname] = desc


def load_pipeline(model_dir, dtype):
    pipe = Flux2KleinPipeline.from_pretrained(model_dir, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    for m in (pipe.text_encoder, pipe.transformer, pipe.vae):
        m.eval()
        assert m.dtype == dtype, (type(m).__name__, m.dtype, dtype)
    return pipe


def to_f32(t):
    return t.detach().float().cpu()


def unpack(pipe, packed, ids, h, w):
    """(1, h*w, C) tokens -> (1, C, h, w) using the pipeline's own unpacking."""
    return pipe._unpack_latents_with_ids(packed, ids, h, w)


# --------------------------------------------------------------------------------------------
# a. text encoder
# --------------------------------------------------------------------------------------------
def encode_with_capture(pipe, prompt):
    cap = {}

    def hook(mod, args, kwargs, output):
        cap["input_ids"] = kwargs["input_ids"].clone()
        cap["attention_mask"] = kwargs["attention_mask"].clone()
        cap["hidden_states"] = tuple(h.clone() for h in output.hidden_states)

    handle = pipe.text_encoder.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            prompt_embeds, text_ids = pipe.encode_prompt(prompt=prompt, device=torch.device("cpu"))
    finally:
        handle.remove()
    return prompt_embeds, text_ids, cap


def run_text_encoder(case, ctx, w):
    pipe, pipe_bf16 = ctx["pipe_f32"], ctx["pipe_bf16"]
    prompt = case["prompt"]
    pe, text_ids, cap = encode_with_capture(pipe, prompt)
    hs = cap["hidden_states"]
    assert len(hs) == pipe.text_encoder.config.num_hidden_layers + 1
    # the pipeline's layout: per token [hs9 | hs18 | hs27]
    expect = torch.cat([hs[k] for k in TE_LAYERS], dim=-1)
    assert torch.equal(expect, pe), "prompt_embeds != concat(hidden_states[9,18,27])"
    w.save("input_ids", cap["input_ids"], np.int64)
    w.save("attention_mask", cap["attention_mask"], np.int64)
    for k in TE_LAYERS:
        w.save(f"hidden_{k}", hs[k])
    for k in case.get("extra_hidden", []):
        w.save(f"hidden_{k}", hs[k])
    w.save("prompt_embeds", pe)

    pe16, _, cap16 = encode_with_capture(pipe_bf16, prompt)
    assert pe16.dtype == torch.bfloat16
    assert torch.equal(cap16["input_ids"], cap["input_ids"])
    w.save("prompt_embeds_bf16", pe16)

    tok = pipe.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=False)
    full_len = len(tok(text)["input_ids"])
    ctx["prompt_embeds"][case["name"]] = {"float32": pe, "bfloat16": pe16}
    d = to_f32(pe16) - to_f32(pe)
    return dict(
        prompt=prompt,
        templated_text=text,
        n_tokens=int(cap["attention_mask"].sum()),
        n_tokens_untruncated=full_len,
        truncated=full_len > 512,
        hidden_state_indices=list(TE_LAYERS) + list(case.get("extra_hidden", [])),
        bf16_vs_f32_max_abs_diff=float(d.abs().max()),
        prompt_embeds_max_abs=float(pe.abs().max()),
    )


# --------------------------------------------------------------------------------------------
# b. transformer
# --------------------------------------------------------------------------------------------
def run_transformer(case, ctx, w):
    pipe = ctx["pipe_f32"]
    tr = pipe.transformer
    W, H = case["width"], case["height"]
    h, wt = H // 16, W // 16
    g = torch.Generator("cpu").manual_seed(case["seed"])
    lat4 = torch.randn((1, 128, h, wt), generator=g, dtype=torch.float32)
    img_ids = pipe._prepare_latent_ids(lat4)  # (1, S, 4)
    hidden_states = pipe._pack_latents(lat4)  # (1, S, 128), token n = y*w + x
    ehs = ctx["prompt_embeds"][case["prompt_case"]]["float32"]
    txt_ids = pipe._prepare_text_ids(ehs)  # (1, 512, 4)
    timestep = torch.tensor([case["timestep"]], dtype=torch.float32)

    rec, handles = {}, []
    if case.get("hooks"):
        def out_hook(name):
            def fn(mod, args, output):
                rec.setdefault(name, []).append(output)
            return fn

        for name in ["x_embedder", "context_embedder", "time_guidance_embed", "double_stream_modulation_img",
                     "double_stream_modulation_txt", "single_stream_modulation", "norm_out"]:
            handles.append(tr.get_submodule(name).register_forward_hook(out_hook(name)))
        for i in range(len(tr.transformer_blocks)):
            handles.append(tr.transformer_blocks[i].register_forward_hook(out_hook(f"transformer_blocks.{i}")))
        for i in range(len(tr.single_transformer_blocks)):
            handles.append(tr.single_transformer_blocks[i].register_forward_hook(
                out_hook(f"single_transformer_blocks.{i}")))
        handles.append(tr.transformer_blocks[0].attn.register_forward_hook(out_hook("transformer_blocks.0.attn")))
        handles.append(tr.single_transformer_blocks[0].attn.register_forward_hook(
            out_hook("single_transformer_blocks.0.attn")))

        def rope_hook(mod, args, kwargs):
            rec["rope"] = kwargs["image_rotary_emb"]
        handles.append(tr.transformer_blocks[0].register_forward_pre_hook(rope_hook, with_kwargs=True))
    try:
        with torch.no_grad():
            out = tr(hidden_states=hidden_states, encoder_hidden_states=ehs, timestep=timestep, img_ids=img_ids,
                     txt_ids=txt_ids, guidance=None, joint_attention_kwargs=None, return_dict=False)[0]
    finally:
        for hd in handles:
            hd.remove()

    w.save("hidden_states", hidden_states)
    w.save("encoder_hidden_states", ehs)
    w.save("timestep", timestep)
    w.save("img_ids", img_ids, np.int64)
    w.save("txt_ids", txt_ids, np.int64)
    w.save("output", out)
    if case.get("hooks"):
        w.save("x_embedder", rec["x_embedder"][0])
        w.save("context_embedder", rec["context_embedder"][0])
        w.save("temb", rec["time_guidance_embed"][0])
        w.save("double_stream_modulation_img", rec["double_stream_modulation_img"][0])
        w.save("double_stream_modulation_txt", rec["double_stream_modulation_txt"][0])
        w.save("single_stream_modulation", rec["single_stream_modulation"][0])
        cos, sin = rec["rope"]
        w.save("rope_cos", cos)
        w.save("rope_sin", sin)
        a_img, a_txt = rec["transformer_blocks.0.attn"][0]
        w.save("transformer_blocks.0.attn.hidden_states", a_img)
        w.save("transformer_blocks.0.attn.encoder_hidden_states", a_txt)
        for i in range(len(tr.transformer_blocks)):
            enc, hid = rec[f"transformer_blocks.{i}"][0]
            w.save(f"transformer_blocks.{i}.encoder_hidden_states", enc)
            w.save(f"transformer_blocks.{i}.hidden_states", hid)
        w.save("single_transformer_blocks.0.attn", rec["single_transformer_blocks.0.attn"][0])
        for i in range(len(tr.single_transformer_blocks)):
            w.save(f"single_transformer_blocks.{i}", rec[f"single_transformer_blocks.{i}"][0])
        w.save("norm_out", rec["norm_out"][0])

    info = dict(width=W, height=H, tokens_h=h, tokens_w=wt, image_seq_len=h * wt, timestep=case["timestep"],
                timestep_fed_to_sinusoid_f32=float((timestep * 1000)[0]),
                hidden_states_seed=case["seed"], prompt_case=case["prompt_case"],
                hidden_states_note="torch.randn((1,128,h,w), generator=Generator('cpu').manual_seed(seed)) "
                                   "packed with _pack_latents")
    if case.get("bf16"):
        tr16 = ctx["pipe_bf16"].transformer
        with torch.no_grad():
            out16 = tr16(hidden_states=hidden_states.to(torch.bfloat16),
                         encoder_hidden_states=ehs.to(torch.bfloat16),
                         timestep=timestep.to(torch.bfloat16), img_ids=img_ids, txt_ids=txt_ids, guidance=None,
                         return_dict=False)[0]
        w.save("output_bf16", out16)
        info["timestep_fed_to_sinusoid_bf16"] = float((timestep.to(torch.bfloat16) * 1000).float()[0])
        info["output_bf16_note"] = ("bf16 transformer (CPU) on the same inputs rounded to bf16 "
                                    "(hidden_states, encoder_hidden_states, timestep)")
        info["bf16_vs_f32_max_abs_diff"] = float((to_f32(out16) - out).abs().max())
    info["output_max_abs"] = float(out.abs().max())
    return info


# --------------------------------------------------------------------------------------------
# c. VAE
# --------------------------------------------------------------------------------------------
def run_vae_decode(case, ctx, w):
    pipe = ctx["pipe_f32"]
    vae = pipe.vae
    W, H = case["width"], case["height"]
    g = torch.Generator("cpu").manual_seed(case["seed"])
    z = torch.randn((1, vae.config.latent_channels, H // 8, W // 8), generator=g, dtype=torch.float32)
    rec, handles = {}, []
    names = ["post_quant_conv", "decoder.conv_in", "decoder.mid_block"] + \
            [f"decoder.up_blocks.{i}" for i in range(len(vae.decoder.up_blocks))] + ["decoder.conv_norm_out"]
    if case.get("hooks"):
        for n in names:
            handles.append(vae.get_submodule(n).register_forward_hook(
                (lambda nn_: (lambda m, a, o: rec.__setitem__(nn_, o)))(n)))
    try:
        with torch.no_grad():
            image = vae.decode(z, return_dict=False)[0]
    finally:
        for hd in handles:
            hd.remove()
    w.save("z", z)
    w.save("image", image)
    if case.get("hooks"):
        for n in names:
            w.save(n, rec[n])
    return dict(width=W, height=H, seed=case["seed"], z_note="torch.randn((1,32,H/8,W/8), "
                "generator=Generator('cpu').manual_seed(seed))", image_min=float(image.min()),
                image_max=float(image.max()))


def run_vae_encode(case, ctx, w):
    pipe = ctx["pipe_f32"]
    vae = pipe.vae
    W, H = case["width"], case["height"]
    g = torch.Generator("cpu").manual_seed(case["seed"])
    x = torch.rand((1, 3, H, W), generator=g, dtype=torch.float32) * 2 - 1
    with torch.no_grad():
        dist = vae.encode(x).latent_dist
        image_latents = pipe._encode_vae_image(x, generator=None)  # mode -> patchify -> BN-normalise
    w.save("image", x)
    w.save("mean", dist.mean)  # = mode(), channels 0..31 of the quant_conv output
    w.save("logvar", dist.logvar)  # clamped to [-30, 20] by DiagonalGaussianDistribution
    w.save("image_latents", image_latents)
    return dict(width=W, height=H, seed=case["seed"],
                image_note="torch.rand((1,3,H,W), generator=Generator('cpu').manual_seed(seed))*2-1",
                image_latents_note="pipe._encode_vae_image: latent_dist.mode() -> _patchify_latents -> "
                                   "(x - bn.running_mean) / sqrt(bn.running_var + batch_norm_eps)")


def run_vae_bn(case, ctx, w):
    vae = ctx["pipe_f32"].vae
    mean = vae.bn.running_mean.detach().clone()
    var = vae.bn.running_var.detach().clone()
    eps = vae.config.batch_norm_eps
    w.save("running_mean", mean)
    w.save("running_var", var)
    w.save("std", torch.sqrt(var + eps))  # as the pipeline computes it (fp32 pipeline)
    w.save("eps", np.array([eps], dtype=np.float32))
    vae16 = ctx["pipe_bf16"].vae
    w.save("std_bf16", torch.sqrt(vae16.bn.running_var + eps))  # bf16 pipeline: bf16 add + bf16 sqrt
    return dict(batch_norm_eps=eps, momentum=vae.config.batch_norm_momentum,
                num_batches_tracked=int(vae.bn.num_batches_tracked),
                note="buffers are stored bf16 in the safetensors; running_mean/var here are those values upcast")


# --------------------------------------------------------------------------------------------
# d. scheduler
# --------------------------------------------------------------------------------------------
def run_scheduler(case, ctx, w):
    pipe = ctx["pipe_f32"]
    entries = []
    for (W, H) in case["sizes"]:
        for N in case["steps"]:
            sched = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config)
            seq_len = (H // 16) * (W // 16)  # = latents.shape[1] in the pipeline
            sigmas_in = np.linspace(1.0, 1 / N, N)
            mu = compute_empirical_mu(image_seq_len=seq_len, num_steps=N)
            timesteps, n = retrieve_timesteps(sched, N, torch.device("cpu"), sigmas=sigmas_in, mu=mu)
            assert n == N and torch.equal(timesteps, sched.timesteps)
            w.save(f"sigmas_{W}x{H}_{N}", sched.sigmas)
            w.save(f"timesteps_{W}x{H}_{N}", sched.timesteps)
            # what reaches the sinusoidal embedding in a bf16 pipeline: t.to(bf16) / 1000 (bf16 op), then
            # inside the transformer .to(bf16) * 1000 (bf16 op); and in an fp32 pipeline: fp32 ops
            fed16 = ((sched.timesteps.to(torch.bfloat16) / 1000).to(torch.bfloat16) * 1000).float()
            fed32 = (sched.timesteps.to(torch.float32) / 1000) * 1000
            entries.append(dict(width=W, height=H, num_steps=N, image_seq_len=seq_len, mu=mu,
                                sigmas_in=[float(s) for s in sigmas_in],
                                sigmas=[float(s) for s in sched.sigmas],
                                timesteps=[float(t) for t in sched.timesteps],
                                timesteps_div_1000_bf16=[float(t) for t in
                                                         (sched.timesteps.to(torch.bfloat16) / 1000).float()],
                                fed_to_sinusoid_bf16=[float(t) for t in fed16],
                                fed_to_sinusoid_f32=[float(t) for t in fed32],
                                timesteps_equal_sigmas_x1000=bool(torch.equal(
                                    sched.timesteps, sched.sigmas[:-1] * 1000))))
    return dict(entries=entries, scheduler_config=dict(pipe.scheduler.config))


# --------------------------------------------------------------------------------------------
# e. noise
# --------------------------------------------------------------------------------------------
def run_noise(case, ctx, w):
    entries = []
    for S in case["seeds"]:
        for shape in case["shapes"]:
            sname = "x".join(str(s) for s in shape)
            f32 = randn_tensor(tuple(shape), generator=torch.Generator("cpu").manual_seed(S),
                               device=torch.device("cpu"), dtype=torch.float32)
            b16 = randn_tensor(tuple(shape), generator=torch.Generator("cpu").manual_seed(S),
                               device=torch.device("cpu"), dtype=torch.bfloat16)
            # the plain torch.randn call must be identical (randn_tensor = torch.randn on the CPU)
            assert torch.equal(f32, torch.randn(tuple(shape), generator=torch.Generator("cpu").manual_seed(S)))
            w.save(f"seed{S}_{sname}_f32", f32)
            w.save(f"seed{S}_{sname}_bf16", b16)
            rounded = f32.to(torch.bfloat16)
            entries.append(dict(seed=S, shape=list(shape),
                                bf16_equals_f32_rounded_to_bf16=bool(torch.equal(rounded, b16)),
                                bf16_vs_f32_rounded_mismatch_count=int((rounded != b16).sum())))
    return dict(entries=entries)


# --------------------------------------------------------------------------------------------
# f. full text-to-image
# --------------------------------------------------------------------------------------------
def run_t2i(case, ctx, w):
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[case["dtype"]]
    pipe = ctx["pipe_f32"] if dtype == torch.float32 else ctx["pipe_bf16"]
    W, H, N = case["width"], case["height"], case["steps"]
    refs = []
    for i, (rw, rh, rs) in enumerate(case.get("refs", [])):
        im = make_ref_image(rw, rh, rs)
        im.save(os.path.join(w.dir, f"ref{i}.png"))
        w.add_file(f"ref{i}.png", {"shape": [rh, rw, 3], "dtype": "uint8", "format": "png"})
        refs.append(Image.open(os.path.join(w.dir, f"ref{i}.png")))  # what a user's file gives
    rec = {"steps": [], "velocity": [], "tr_timestep": [], "tr_inputs": []}

    orig_prepare = pipe.prepare_latents
    orig_decode = pipe.vae.decode

    def prepare_latents(*a, **k):
        out = orig_prepare(*a, **k)
        rec["latents0"] = out[0].clone()
        rec["latent_ids"] = out[1].clone()
        return out

    orig_prepare_img = pipe.prepare_image_latents

    def prepare_image_latents(*a, **k):
        out = orig_prepare_img(*a, **k)
        rec["ref_latents"] = out[0].clone()
        rec["ref_ids"] = out[1].clone()
        return out

    def decode(z, *a, **k):
        out = orig_decode(z, *a, **k)
        rec["z"] = z.clone()
        rec["image"] = (out[0] if isinstance(out, tuple) else out.sample).clone()
        return out

    def tr_hook(mod, args, kwargs, output):
        rec["tr_timestep"].append(kwargs["timestep"].clone())
        rec["velocity"].append(output[0].clone())

    def cb(p, i, t, kw):
        rec["steps"].append((i, float(t), kw["latents"].clone()))
        return {}

    pipe.prepare_latents = prepare_latents
    pipe.prepare_image_latents = prepare_image_latents
    pipe.vae.decode = decode
    hd = pipe.transformer.register_forward_hook(tr_hook, with_kwargs=True)
    try:
        with torch.no_grad():
            images = pipe(image=refs or None, prompt=case["prompt"], height=H, width=W, num_inference_steps=N,
                          guidance_scale=1.0,
                          generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np",
                          callback_on_step_end=cb, callback_on_step_end_tensor_inputs=["latents"]).images
    finally:
        del pipe.prepare_latents
        del pipe.prepare_image_latents
        del pipe.vae.decode
        hd.remove()

    ids = rec["latent_ids"]
    H, W = int(images.shape[1]), int(images.shape[2])  # the output size (from the first reference if None)
    h, wt = H // 16, W // 16
    noise = unpack(pipe, rec["latents0"], ids, h, wt)
    # the initial latents are exactly randn_tensor((1,128,h,w), Generator('cpu').manual_seed(seed), dtype)
    expect = randn_tensor((1, 128, h, wt), generator=torch.Generator("cpu").manual_seed(case["seed"]),
                          device=torch.device("cpu"), dtype=dtype)
    assert torch.equal(noise, expect), "initial latents differ from randn_tensor"
    w.save("noise", noise)
    w.save("img_ids", ids, np.int64)
    assert len(rec["steps"]) == N and len(rec["velocity"]) == N
    for k, (i, t, lat) in enumerate(rec["steps"], start=1):
        w.save(f"latents_step{k}", unpack(pipe, lat, ids, h, wt))
        w.save(f"velocity_step{k}", unpack(pipe, rec["velocity"][k - 1][:, : h * wt], ids, h, wt))
    if refs:
        w.save("ref_latents", rec["ref_latents"])  # [1, S_ref, 128], normalised packed tokens
        w.save("ref_ids", rec["ref_ids"], np.int64)
    w.save("latents_final", rec["z"])
    w.save("image", rec["image"])

    # the pipeline's own post-processing of the captured decoder output
    img = rec["image"]
    pp_np = pipe.image_processor.postprocess(img, output_type="np")
    assert np.array_equal(pp_np, images), "postprocess(np) of captured decoder output != pipeline output"
    pil = pipe.image_processor.postprocess(img, output_type="pil")[0]
    u8 = np.array(pil)
    assert u8.dtype == np.uint8 and u8.shape == (H, W, 3)
    w.save("image_u8", u8, np.uint8)
    pil.save(os.path.join(w.dir, "image.png"))
    w.add_file("image.png", {"shape": [H, W, 3], "dtype": "uint8", "format": "png"})

    # prompt_embeds used must be exactly the text-encoder case's
    pe_ref = ctx["prompt_embeds"][case["prompt_case"]][case["dtype"]]
    pe_check, _, _ = encode_with_capture(pipe, case["prompt"])
    assert torch.equal(pe_check, pe_ref)

    scheduler = pipe.scheduler
    return dict(prompt=case["prompt"], width=W, height=H, width_arg=case["width"], height_arg=case["height"],
                refs=["ref%d.png" % i for i in range(len(refs))], tokens_h=h, tokens_w=wt, num_inference_steps=N,
                seed=case["seed"], generator="torch.Generator('cpu').manual_seed(seed)", dtype=case["dtype"],
                guidance_scale=1.0, guidance_note="is_distilled=true: CFG is off whatever guidance_scale is",
                prompt_embeds="same as ref/%s/%s" % (case["prompt_case"], "prompt_embeds.npy" if dtype ==
                                                     torch.float32 else "prompt_embeds_bf16.npy"),
                mu=compute_empirical_mu(h * wt, N),
                sigmas=[float(s) for s in scheduler.sigmas],
                timesteps=[t for (_, t, _) in rec["steps"]],
                transformer_timestep_input=[float(t.float()[0]) for t in rec["tr_timestep"]],
                noise_note=("initial latents = randn_tensor((1,128,H/16,W/16), generator, dtype=%s); "
                            "values only depend on seed and numel (row-major), e.g. (1,128,5,3) is a reshape "
                            "of (1,128,3,5)" % case["dtype"]))


RUNNERS = dict(text_encoder=run_text_encoder, transformer=run_transformer, vae_decode=run_vae_decode,
               vae_encode=run_vae_encode, vae_bn=run_vae_bn, scheduler=run_scheduler, noise=run_noise,
               t2i=run_t2i)


def verify(out_root):
    """Check that every file listed in manifest.json exists, has the listed shape/dtype and is finite."""
    with open(os.path.join(out_root, "manifest.json")) as fh:
        manifest = json.load(fh)
    n = 0
    for case in manifest["cases"]:
        for fname, desc in case["files"].items():
            path = os.path.join(out_root, case["dir"], fname)
            assert os.path.exists(path), path
            if fname.endswith(".npy"):
                a = np.load(path)
                assert list(a.shape) == desc["shape"] and str(a.dtype) == desc["dtype"], (path, a.shape, a.dtype)
                if np.issubdtype(a.dtype, np.floating):
                    assert np.all(np.isfinite(a)), path
            n += 1
    print(f"verified {n} files in {len(manifest['cases'])} cases: all present, shapes/dtypes as listed, finite")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verify", action="store_true", help="only check tests/data/ref against its manifest")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", default=None, help="case names to (re)run")
    args = ap.parse_args()
    if args.verify:
        return verify(args.out)

    torch.manual_seed(0)
    ctx = {
        "pipe_f32": load_pipeline(args.model, torch.float32),
        "pipe_bf16": load_pipeline(args.model, torch.bfloat16),
        "prompt_embeds": {},
    }
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.json")
    old = {}
    if args.only and os.path.exists(manifest_path):
        with open(manifest_path) as fh:
            old = {c["name"]: c for c in json.load(fh)["cases"]}

    selected = set(args.only) if args.only else None
    # text-encoder cases are always computed (other cases need their prompt_embeds) but only written if selected
    out_cases = []
    for case in CASES:
        run = selected is None or case["name"] in selected
        if not run and case["kind"] != "text_encoder":
            if case["name"] in old:
                out_cases.append(old[case["name"]])
            continue
        out_root = args.out if run else os.path.join(args.out, ".scratch")
        w = CaseWriter(out_root, case["name"])
        info = RUNNERS[case["kind"]](case, ctx, w)
        if not run:
            shutil.rmtree(os.path.join(args.out, ".scratch"))
            if case["name"] in old:
                out_cases.append(old[case["name"]])
            continue
        entry = dict(name=case["name"], kind=case["kind"], dir=case["name"])
        entry.update(info)
        entry["files"] = w.files
        out_cases.append(entry)
        print(f"[{case['kind']:12s}] {case['name']:18s} {len(w.files):3d} files")

    manifest = dict(
        description="Reference tensors for klein.cpp, dumped from the tiny model in tests/data/tiny with the "
                    "real diffusers Flux2KleinPipeline. See scripts/reference/README.md for layouts.",
        model_dir="tests/data/tiny",
        versions=dict(torch=torch.__version__, diffusers=diffusers.__version__,
                      transformers=transformers.__version__, numpy=np.__version__),
        device="cpu",
        attention=dict(text_encoder=ctx["pipe_f32"].text_encoder.config._attn_implementation,
                       diffusers_backend=os.environ.get("DIFFUSERS_ATTN_BACKEND")),
        text_encoder_layers=list(TE_LAYERS),
        cases=out_cases,
    )
    with open(manifest_path, "w") as fh:
        json.dump(manifest, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    total = 0
    for root, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"wrote {manifest_path}; ref size {total} bytes")
    return verify(args.out)


if __name__ == "__main__":
    sys.exit(main())
