#!/usr/bin/env python3
"""Write the tiny model (tests/data/tiny) as the single files users hold, for klein's checkpoint layer.

klein must never write its own fixtures for its name maps: this script is the independent writer.
It converts the tiny diffusers components back to the original namings with its own tables
(written from BFL's FLUX.2 module names and the LDM autoencoder's, not from klein's maps) and
writes them with the safetensors package:

    tests/data/single_file/tiny-flux2-bfl.safetensors        BFL / ComfyUI diffusion_models names
    tests/data/single_file/tiny-flux2-bfl-comfy.safetensors  the same under "model.diffusion_model."
                                                             (a ComfyUI SaveCheckpoint file's DiT)
    tests/data/single_file/tiny-flux2-vae-ldm.safetensors    BFL ae.safetensors / ComfyUI flux2-vae names
    tests/data/single_file/tiny-flux2-all-in-one.safetensors ComfyUI SaveCheckpoint: the DiT (BFL names) under
                                                             "model.diffusion_model.", the VAE (LDM names) under
                                                             "vae.", the Qwen3 text encoder (transformers names)
                                                             under "text_encoders.qwen3_4b.transformer."
    tests/data/single_file/config.json                       the tiny VAE's config.json: its GroupNorm count (4)
                                                             is not in the weights (released VAEs use 32)

The Qwen3 single file is tests/data/tiny/text_encoder/model.safetensors itself: transformers saves
a small model as one file, under the names ComfyUI's qwen_3_4b.safetensors uses.

Each file verifies itself: diffusers' own converters (single_file_utils.py:
convert_flux2_transformer_checkpoint_to_diffusers; convert_ldm_vae_checkpoint after lifting FLUX.2's
encoder.quant_conv / decoder.post_quant_conv to the top level, as ComfyUI does) must give back the
original diffusers tensors exactly (names, dtypes, shapes, values). The script exits non-zero otherwise.

Usage (from the repository root, with the oracle venv of scripts/reference/README.md):
    python scripts/reference/make_single_files.py            # writes tests/data/single_file
    python scripts/reference/make_single_files.py --out DIR
Deterministic: a rerun gives byte-identical files.
"""

import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(REPO_ROOT, "tests", "data", "tiny")
COMFY_DIT_PREFIX = "model.diffusion_model."
# ComfyUI supported_models.py: Flux2's VAE and its Qwen3 4B text encoder in a saved checkpoint.
COMFY_VAE_PREFIX = "vae."
COMFY_TE_PREFIX = "text_encoders.qwen3_4b.transformer."


def dit_to_bfl(sd, num_layers, num_single_layers):
    """diffusers Flux2Transformer2DModel -> BFL FLUX.2 names (flux2/src/flux2/model.py modules)."""
    top = {
        "x_embedder": "img_in",
        "context_embedder": "txt_in",
        "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
        "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
        "time_guidance_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
        "time_guidance_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
        "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
        "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
        "single_stream_modulation.linear": "single_stream_modulation.lin",
        "proj_out": "final_layer.linear",
    }
    double = {
        "attn.to_out.0": "img_attn.proj",
        "attn.to_add_out": "txt_attn.proj",
        "ff.linear_in": "img_mlp.0",
        "ff.linear_out": "img_mlp.2",
        "ff_context.linear_in": "txt_mlp.0",
        "ff_context.linear_out": "txt_mlp.2",
        "attn.norm_q": "img_attn.norm.query_norm",
        "attn.norm_k": "img_attn.norm.key_norm",
        "attn.norm_added_q": "txt_attn.norm.query_norm",
        "attn.norm_added_k": "txt_attn.norm.key_norm",
    }
    single = {
        "attn.to_qkv_mlp_proj": "linear1",
        "attn.to_out": "linear2",
        "attn.norm_q": "norm.query_norm",
        "attn.norm_k": "norm.key_norm",
    }
    sd = dict(sd)
    out = {}

    def take(src, dst):
        out[dst] = sd.pop(src)

    for d, b in top.items():
        for p in ("weight", "bias"):
            if f"{d}.{p}" in sd:
                take(f"{d}.{p}", f"{b}.{p}")
    # BFL's final modulation computes (shift, scale); diffusers stores (scale, shift).
    scale, shift = sd.pop("norm_out.linear.weight").chunk(2, dim=0)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale], dim=0)
    for i in range(num_layers):
        d, b = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for names, fused in ((("to_q", "to_k", "to_v"), "img_attn.qkv"),
                             (("add_q_proj", "add_k_proj", "add_v_proj"), "txt_attn.qkv")):
            out[f"{b}{fused}.weight"] = torch.cat([sd.pop(f"{d}attn.{n}.weight") for n in names], dim=0)
        for dn, bn in double.items():
            # RMSNorm parameters are called "scale" in BFL's code.
            take(f"{d}{dn}.weight", f"{b}{bn}.scale" if "norm" in dn else f"{b}{bn}.weight")
    for i in range(num_single_layers):
        d, b = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for dn, bn in single.items():
            take(f"{d}{dn}.weight", f"{b}{bn}.scale" if "norm" in dn else f"{b}{bn}.weight")
    if sd:
        sys.exit(f"make_single_files: transformer tensors without a BFL name: {sorted(sd)}")
    return out


def vae_to_ldm(sd, levels, layers_per_block):
    """diffusers AutoencoderKLFlux2 -> the LDM names of BFL's ae.safetensors (FLUX.2 AutoEncoder)."""
    sd = dict(sd)
    out = {}

    def move(src_prefix, dst_prefix):
        for k in [k for k in sd if k.startswith(src_prefix)]:
            v = sd.pop(k)
            rest = k[len(src_prefix):].replace("conv_shortcut", "nin_shortcut")
            out[dst_prefix + rest] = v

    for p in ("weight", "bias"):
        out[f"encoder.quant_conv.{p}"] = sd.pop(f"quant_conv.{p}")
        out[f"decoder.post_quant_conv.{p}"] = sd.pop(f"post_quant_conv.{p}")
    move("bn.", "bn.")
    for part in ("encoder", "decoder"):
        move(f"{part}.conv_in.", f"{part}.conv_in.")
        move(f"{part}.conv_out.", f"{part}.conv_out.")
        move(f"{part}.conv_norm_out.", f"{part}.norm_out.")
        move(f"{part}.mid_block.resnets.0.", f"{part}.mid.block_1.")
        move(f"{part}.mid_block.resnets.1.", f"{part}.mid.block_2.")
        a, l = f"{part}.mid_block.attentions.0.", f"{part}.mid.attn_1."
        move(a + "group_norm.", l + "norm.")
        for dn, ln in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "proj_out")):
            # LDM's attention projections are 1x1 convolutions.
            out[f"{l}{ln}.weight"] = sd.pop(f"{a}{dn}.weight")[:, :, None, None].contiguous()
            out[f"{l}{ln}.bias"] = sd.pop(f"{a}{dn}.bias")
    for i in range(levels):
        for j in range(layers_per_block):
            move(f"encoder.down_blocks.{i}.resnets.{j}.", f"encoder.down.{i}.block.{j}.")
        move(f"encoder.down_blocks.{i}.downsamplers.0.conv.", f"encoder.down.{i}.downsample.conv.")
        # LDM numbers the decoder's levels from the finest up; diffusers from the deepest down.
        b = levels - 1 - i
        for j in range(layers_per_block + 1):
            move(f"decoder.up_blocks.{i}.resnets.{j}.", f"decoder.up.{b}.block.{j}.")
        move(f"decoder.up_blocks.{i}.upsamplers.0.conv.", f"decoder.up.{b}.upsample.conv.")
    if sd:
        sys.exit(f"make_single_files: VAE tensors without an LDM name: {sorted(sd)}")
    return out


def same(got, want, what):
    if set(got) != set(want):
        sys.exit(f"make_single_files: {what}: diffusers' converter gives other names: "
                 f"missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}")
    for k in want:
        g, w = got[k], want[k]
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            sys.exit(f"make_single_files: {what}: '{k}' differs after diffusers' converter "
                     f"({g.dtype} {tuple(g.shape)} vs {w.dtype} {tuple(w.shape)})")


def check_ldm_vae(ldm, vcfg, want, what):
    """diffusers' convert_ldm_vae_checkpoint must give back `want`, after FLUX.2's quant convs are
    lifted to the top level (as ComfyUI does)."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    lifted = {("quant_conv." + k[len("encoder.quant_conv."):]) if k.startswith("encoder.quant_conv.") else
              ("post_quant_conv." + k[len("decoder.post_quant_conv."):]) if k.startswith("decoder.post_quant_conv.")
              else k: v for k, v in ldm.items()}
    got = convert_ldm_vae_checkpoint(lifted, vcfg)
    # diffusers' LDM converter leaves the FLUX.2 batch norm alone (it is not an LDM tensor).
    got.update({k: v for k, v in lifted.items() if k.startswith("bn.")})
    same(got, want, what)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "tests", "data", "single_file"))
    args = ap.parse_args()
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    os.makedirs(args.out, exist_ok=True)
    meta = {"format": "pt"}

    with open(os.path.join(TINY, "transformer", "config.json")) as f:
        cfg = json.load(f)
    dit = load_file(os.path.join(TINY, "transformer", "diffusion_pytorch_model.safetensors"))
    bfl = dit_to_bfl(dit, cfg["num_layers"], cfg["num_single_layers"])
    same(convert_flux2_transformer_checkpoint_to_diffusers(dict(bfl)), dit, "BFL transformer")
    save_file(bfl, os.path.join(args.out, "tiny-flux2-bfl.safetensors"), metadata=meta)
    comfy = {COMFY_DIT_PREFIX + k: v for k, v in bfl.items()}
    save_file(comfy, os.path.join(args.out, "tiny-flux2-bfl-comfy.safetensors"), metadata=meta)

    with open(os.path.join(TINY, "vae", "config.json")) as f:
        vcfg = json.load(f)
    vae = load_file(os.path.join(TINY, "vae", "diffusion_pytorch_model.safetensors"))
    ldm = vae_to_ldm(vae, len(vcfg["block_out_channels"]), vcfg["layers_per_block"])
    check_ldm_vae(ldm, vcfg, vae, "LDM VAE")
    save_file(ldm, os.path.join(args.out, "tiny-flux2-vae-ldm.safetensors"), metadata=meta)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(vcfg, f, indent=2, sort_keys=True)
        f.write("\n")

    # The all-in-one checkpoint: the three parts under ComfyUI's prefixes. Each part, its prefix
    # removed, must go through the converters above (the text encoder is already in transformers
    # names) back to the tiny model.
    te = load_file(os.path.join(TINY, "text_encoder", "model.safetensors"))
    aio = {}
    for prefix, part in ((COMFY_DIT_PREFIX, bfl), (COMFY_VAE_PREFIX, ldm), (COMFY_TE_PREFIX, te)):
        aio.update({prefix + k: v for k, v in part.items()})

    def part_of(prefix):
        return {k[len(prefix):]: v for k, v in aio.items() if k.startswith(prefix)}

    if len(aio) != len(bfl) + len(ldm) + len(te):
        sys.exit("make_single_files: all-in-one: the prefixes overlap")
    same(convert_flux2_transformer_checkpoint_to_diffusers(part_of(COMFY_DIT_PREFIX)), dit, "all-in-one transformer")
    check_ldm_vae(part_of(COMFY_VAE_PREFIX), vcfg, vae, "all-in-one VAE")
    same(part_of(COMFY_TE_PREFIX), te, "all-in-one text encoder")
    save_file(aio, os.path.join(args.out, "tiny-flux2-all-in-one.safetensors"), metadata=meta)
    print(f"make_single_files: wrote {len(bfl)} + {len(comfy)} transformer, {len(ldm)} VAE and {len(aio)} all-in-one "
          f"tensors to {args.out}; diffusers' converters give back the tiny model exactly")


if __name__ == "__main__":
    main()
