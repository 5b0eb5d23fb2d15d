#!/usr/bin/env python3
"""LoRA fixtures for klein.cpp's tests (tests/data/lora/), made with the pinned oracle + PEFT.

One PEFT LoRA (r=4, lora_alpha=8: scale 2) on every linear of the tiny DiT (tests/data/tiny) and
one on the text encoder's attention and MLP projections, with random factors, saved in each key
scheme that trainers write:

  lora_diffusers.safetensors  diffusers/PEFT: `transformer.<module>.lora_A/B.weight`, alpha in the
                              header (`lora_adapter_metadata`), as Flux2KleinPipeline.save_lora_weights
                              writes (train_dreambooth_lora_flux2_klein.py)
  lora_bfl.safetensors        ai-toolkit / fal: `diffusion_model.<BFL module>.lora_A/B.weight`, no
                              alpha (the scale baked into B; diffusers' ai-toolkit converter
                              _convert_non_diffusers_flux2_lora_to_diffusers takes alpha = rank)
  lora_kohya.safetensors      kohya / musubi-tuner: `lora_unet_<BFL module, '_' for '.'>.lora_down/
                              lora_up.weight` + `.alpha` (musubi-tuner docs/flux_2.md; diffusers
                              _convert_kohya_flux2_lora_to_diffusers)
  lora_te.safetensors         the text encoder's LoRA, `text_encoder.<transformers module>...` with
                              its alpha in the header
  lokr_bfl.safetensors        LyCORIS LoKr on BFL names (`lokr_w1`, `lokr_w2_a/_b`, `alpha`)
  loha.safetensors            LyCORIS LoHa on diffusers names (`hada_w1_a/b`, `hada_w2_a/b`, `alpha`)

A BFL fused qkv holds q, k and v's LoRAs as one: lora_A = [A_q; A_k; A_v] (rank 3r) and
lora_B = blockdiag(B_q, B_k, B_v), so that B·A = [B_q A_q; B_k A_k; B_v A_v] (ai-toolkit trains the
fused layer; diffusers' converters copy A to q, k, v and cut B by rows, or - kohya, block-sparse -
cut both). The kohya file holds only the modules diffusers' kohya converter maps (it drops the
modulations, the guidance/time embedders' extras and the final modulation with a warning), so
that diffusers' images are comparable; the BFL file leaves out `final_layer.adaLN_modulation.1`,
which diffusers' ai-toolkit converter maps without the (shift, scale) -> (scale, shift) swap of its
base-weight converter (docs/lora.md): klein swaps it, and the test checks that against the
diffusers-named module instead.

Reference outputs (tests/data/lora/<case>/latents_final.npy, the VAE decoder's input, and
image_u8.npy), 64x64, 4 steps, seed 42, the te_cat prompt, float32 pipeline:
  diffusers_s1 / diffusers_s05        load_lora_weights, unfused, scale 1.0 / 0.5 (attention_kwargs)
  diffusers_fused_s1 / _fused_s05     the same, fused (fuse_lora(lora_scale=...))
  bfl_s1, kohya_s1                    the other schemes loaded by diffusers, unfused, scale 1.0
  te_s1                               the text-encoder LoRA (PEFT on the encoder; diffusers'
                                      Flux2 loader loads transformer LoRAs only), with the DiT LoRA
LoKr / LoHa: lokr_delta/ and loha_delta/ hold the dense deltas (<target weight>.npy) (the formula, with torch),
which the test compares with what klein parses and merges.

Run: /work/oracle/bin/python scripts/reference/make_lora_fixtures.py
"""

import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DIFFUSERS_ATTN_BACKEND", "native")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import diffusers  # noqa: E402
import peft  # noqa: E402
from diffusers import Flux2KleinPipeline  # noqa: E402
from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model, set_peft_model_state_dict  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(REPO, "tests", "data", "tiny")
OUT = os.path.join(REPO, "tests", "data", "lora")
CAT = "A cat holding a sign that says hello world"
R, ALPHA = 4, 8.0
W = H = 64
STEPS, SEED = 4, 42


def load_pipe():
    pipe = Flux2KleinPipeline.from_pretrained(TINY, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def linear_names(model):
    return sorted(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))


def random_lora(model, targets, seed, std_a=0.15, std_b=0.05):
    """PEFT LoRA factors for `targets` of `model`: A [r, in], B [out, r] (PEFT's names), random."""
    g = torch.Generator().manual_seed(seed)
    mods = dict(model.named_modules())
    sd = {}
    for n in targets:
        lin = mods[n]
        sd[f"{n}.lora_A.weight"] = torch.randn(R, lin.in_features, generator=g) * std_a
        sd[f"{n}.lora_B.weight"] = torch.randn(lin.out_features, R, generator=g) * std_b
    return sd


# diffusers module -> BFL module, the inverse of diffusers' ai-toolkit converter
# (lora_conversion_utils.py, _convert_non_diffusers_flux2_lora_to_diffusers) for one block index.
def bfl_name(n):
    p = n.split(".")
    if p[0] == "transformer_blocks":
        i, rest = p[1], ".".join(p[2:])
        m = {"attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
             "ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2",
             "ff_context.linear_in": "txt_mlp.0", "ff_context.linear_out": "txt_mlp.2"}
        return f"double_blocks.{i}.{m[rest]}" if rest in m else None
    if p[0] == "single_transformer_blocks":
        i, rest = p[1], ".".join(p[2:])
        return f"single_blocks.{i}." + {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2"}[rest]
    m = {"x_embedder": "img_in", "context_embedder": "txt_in",
         "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
         "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
         "time_guidance_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
         "time_guidance_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
         "proj_out": "final_layer.linear", "norm_out.linear": "final_layer.adaLN_modulation.1",
         "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
         "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
         "single_stream_modulation.linear": "single_stream_modulation.lin"}
    return m.get(n)


QKV = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
       "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}


def bfl_modules(sd, nblocks, scale, keep):
    """{BFL module: (A, B)} from a diffusers-named PEFT state dict; `scale` baked into B."""
    out = {}
    names = sorted({k[: -len(".lora_A.weight")] for k in sd if k.endswith(".lora_A.weight")})
    for n in names:
        b = bfl_name(n)
        if b and keep(b):
            out[b] = (sd[f"{n}.lora_A.weight"], sd[f"{n}.lora_B.weight"] * scale)
    for i in range(nblocks):
        for fused, parts in QKV.items():
            a = torch.cat([sd[f"transformer_blocks.{i}.{q}.lora_A.weight"] for q in parts], 0)
            b = torch.block_diag(*[sd[f"transformer_blocks.{i}.{q}.lora_B.weight"] for q in parts]) * scale
            out[f"double_blocks.{i}.{fused}"] = (a, b)
    return out


def save_deltas(folder, deltas):
    """Dense deltas as <folder>/<target weight name>.npy (float32)."""
    os.makedirs(os.path.join(OUT, folder), exist_ok=True)
    for name, d in deltas.items():
        np.save(os.path.join(OUT, folder, name + ".npy"), d.float().numpy())


def t2i(pipe, case_dir, prompt_embeds=None, **kw):
    rec = {}
    orig = pipe.vae.decode

    def decode(z, *a, **k):
        rec["z"] = z.clone()
        return orig(z, *a, **k)

    pipe.vae.decode = decode
    try:
        with torch.no_grad():
            args = dict(height=H, width=W, num_inference_steps=STEPS, guidance_scale=1.0,
                        generator=torch.Generator("cpu").manual_seed(SEED), output_type="pil", **kw)
            if prompt_embeds is None:
                args["prompt"] = CAT
            else:
                args["prompt_embeds"] = prompt_embeds
            img = pipe(**args).images[0]
    finally:
        del pipe.vae.decode
    os.makedirs(case_dir, exist_ok=True)
    np.save(os.path.join(case_dir, "latents_final.npy"), rec["z"].float().numpy())
    np.save(os.path.join(case_dir, "image_u8.npy"), np.array(img, dtype=np.uint8))


def main():
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    pipe = load_pipe()
    dit, te = pipe.transformer, pipe.text_encoder
    nblocks = len(dit.transformer_blocks)

    # ---- the DiT LoRA, every linear
    dit_targets = linear_names(dit)
    dit_sd = random_lora(dit, dit_targets, seed=7)
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=dit_targets, init_lora_weights=False)
    meta = {f"transformer.{k}": v for k, v in cfg.to_dict().items()}
    for k, v in list(meta.items()):
        if isinstance(v, set):
            meta[k] = sorted(v)
    save_file({f"transformer.{k}": v.contiguous() for k, v in dit_sd.items()},
              os.path.join(OUT, "lora_diffusers.safetensors"),
              metadata={"format": "pt", "lora_adapter_metadata": json.dumps(meta, sort_keys=True)})

    scale = ALPHA / R
    bfl = bfl_modules(dit_sd, nblocks, scale, keep=lambda b: b != "final_layer.adaLN_modulation.1")
    sd = {}
    for m, (a, b) in bfl.items():
        sd[f"diffusion_model.{m}.lora_A.weight"] = a.contiguous()
        sd[f"diffusion_model.{m}.lora_B.weight"] = b.contiguous()
    save_file(sd, os.path.join(OUT, "lora_bfl.safetensors"), metadata={"format": "pt"})
    # The final layer alone, BFL-named with its halves in BFL order (shift, scale): klein must
    # parse it into the diffusers-named module's delta.
    a = dit_sd["norm_out.linear.lora_A.weight"]
    b = dit_sd["norm_out.linear.lora_B.weight"]
    half = b.shape[0] // 2
    save_file({"diffusion_model.final_layer.adaLN_modulation.1.lora_A.weight": a.contiguous(),
               "diffusion_model.final_layer.adaLN_modulation.1.lora_B.weight": torch.cat([b[half:], b[:half]]).contiguous(),
               "diffusion_model.final_layer.adaLN_modulation.1.alpha": torch.tensor(ALPHA)},
              os.path.join(OUT, "lora_bfl_final_layer.safetensors"), metadata={"format": "pt"})

    kohya_keep = ("img_attn", "txt_attn", "img_mlp", "txt_mlp", "linear1", "linear2", "img_in", "txt_in",
                  "time_in", "final_layer.linear")
    kohya = bfl_modules(dit_sd, nblocks, 1.0, keep=lambda b: any(k in b for k in kohya_keep))
    sd = {}
    for m, (a, b) in kohya.items():
        k = "lora_unet_" + m.replace(".", "_")
        sd[f"{k}.lora_down.weight"] = a.contiguous()
        sd[f"{k}.lora_up.weight"] = b.contiguous()
        sd[f"{k}.alpha"] = torch.tensor(scale * a.shape[0])  # alpha / rank = the PEFT scale
    save_file(sd, os.path.join(OUT, "lora_kohya.safetensors"), metadata={"format": "pt"})

    # ---- the text encoder's LoRA
    te_targets = [n for n in linear_names(te) if ".layers." in n and n.split(".")[-1] in
                  ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]
    te_sd = random_lora(te, te_targets, seed=11, std_a=0.1, std_b=0.05)
    te_cfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=te_targets, init_lora_weights=False)
    te_meta = {f"text_encoder.{k}": (sorted(v) if isinstance(v, set) else v) for k, v in te_cfg.to_dict().items()}
    save_file({f"text_encoder.{k}": v.contiguous() for k, v in te_sd.items()},
              os.path.join(OUT, "lora_te.safetensors"),
              metadata={"format": "pt", "lora_adapter_metadata": json.dumps(te_meta, sort_keys=True)})

    # ---- reference images through diffusers
    def with_lora(fname, case, fuse=None, scale_kw=None):
        pipe.load_lora_weights(os.path.join(OUT, fname), adapter_name="a")
        if fuse is not None:
            pipe.fuse_lora(lora_scale=fuse, adapter_names=["a"])
        kw = {"attention_kwargs": {"scale": scale_kw}} if scale_kw is not None else {}
        t2i(pipe, os.path.join(OUT, case), **kw)
        if fuse is not None:
            pipe.unfuse_lora()
        pipe.unload_lora_weights()

    with_lora("lora_diffusers.safetensors", "diffusers_s1")
    with_lora("lora_diffusers.safetensors", "diffusers_s05", scale_kw=0.5)
    with_lora("lora_diffusers.safetensors", "diffusers_fused_s1", fuse=1.0)
    with_lora("lora_diffusers.safetensors", "diffusers_fused_s05", fuse=0.5)
    with_lora("lora_bfl.safetensors", "bfl_s1")
    with_lora("lora_kohya.safetensors", "kohya_s1")

    # The text encoder with PEFT (diffusers' Flux2 loader reads transformer LoRAs only), the DiT's
    # LoRA through diffusers as above.
    inject_adapter_in_model(te_cfg, te, adapter_name="te")
    set_peft_model_state_dict(te, te_sd, adapter_name="te")
    with torch.no_grad():
        pe, _ = pipe.encode_prompt(prompt=CAT, device=torch.device("cpu"))
    from peft.tuners.tuners_utils import BaseTunerLayer
    for m in te.modules():  # back to the plain encoder (nothing else uses it afterwards)
        if isinstance(m, BaseTunerLayer):
            m.merge()
    pipe.load_lora_weights(os.path.join(OUT, "lora_diffusers.safetensors"), adapter_name="a")
    t2i(pipe, os.path.join(OUT, "te_s1"), prompt_embeds=pe)
    pipe.unload_lora_weights()

    # ---- LyCORIS: the dense deltas by the formula
    g = torch.Generator().manual_seed(13)
    # LoKr on the BFL fused qkv of double block 0 (rows 3*32 = 96 = 8*12, cols 32 = 4*8) and on
    # linear1 of single block 1 with w2 split (rank 2), alpha 3.
    qkv_rows, cols = 3 * 32, 32
    w1 = torch.randn(8, 4, generator=g) * 0.3
    w2 = torch.randn(12, 8, generator=g) * 0.3
    lin1 = dict(dit.named_modules())["single_transformer_blocks.1.attn.to_qkv_mlp_proj"]
    o1, i1 = lin1.out_features, lin1.in_features  # 288 x 32
    v1 = torch.randn(4, 2, generator=g) * 0.3
    v2a = torch.randn(o1 // 4, 2, generator=g) * 0.3
    v2b = torch.randn(2, i1 // 2, generator=g) * 0.3
    lokr = {"diffusion_model.double_blocks.0.img_attn.qkv.lokr_w1": w1,
            "diffusion_model.double_blocks.0.img_attn.qkv.lokr_w2": w2,
            "diffusion_model.single_blocks.1.linear1.lokr_w1": v1,
            "diffusion_model.single_blocks.1.linear1.lokr_w2_a": v2a,
            "diffusion_model.single_blocks.1.linear1.lokr_w2_b": v2b,
            "diffusion_model.single_blocks.1.linear1.alpha": torch.tensor(3.0)}
    save_file({k: v.contiguous() for k, v in lokr.items()}, os.path.join(OUT, "lokr_bfl.safetensors"))
    d_qkv = torch.kron(w1, w2)  # full factors: LyCORIS applies no alpha
    d_lin1 = torch.kron(v1, v2a @ v2b) * (3.0 / 2)
    save_deltas("lokr_delta", {"transformer_blocks.0.attn.to_q.weight": d_qkv[0:32],
                               "transformer_blocks.0.attn.to_k.weight": d_qkv[32:64],
                               "transformer_blocks.0.attn.to_v.weight": d_qkv[64:96],
                               "single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight": d_lin1})
    # LoHa on a diffusers-named module, rank 3, alpha 6
    ff = dict(dit.named_modules())["transformer_blocks.1.ff.linear_in"]
    o, i = ff.out_features, ff.in_features
    h = {s: torch.randn(*shp, generator=g) * 0.3 for s, shp in
         [("hada_w1_a", (o, 3)), ("hada_w1_b", (3, i)), ("hada_w2_a", (o, 3)), ("hada_w2_b", (3, i))]}
    save_file({**{f"transformer.transformer_blocks.1.ff.linear_in.{s}": v.contiguous() for s, v in h.items()},
               "transformer.transformer_blocks.1.ff.linear_in.alpha": torch.tensor(6.0)},
              os.path.join(OUT, "loha.safetensors"))
    d = (h["hada_w1_a"] @ h["hada_w1_b"]) * (h["hada_w2_a"] @ h["hada_w2_b"]) * (6.0 / 3)
    save_deltas("loha_delta", {"transformer_blocks.1.ff.linear_in.weight": d})

    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump({"diffusers": diffusers.__version__, "peft": peft.__version__, "torch": torch.__version__,
                   "prompt": CAT, "width": W, "height": H, "steps": STEPS, "seed": SEED, "rank": R,
                   "lora_alpha": ALPHA}, f, indent=2, sort_keys=True)
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fs in os.walk(OUT) for fn in fs)
    print(f"wrote {OUT}: {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
