#!/usr/bin/env python3
"""Write the tiny transformer (tests/data/tiny/transformer) as the fp8 / int8 files users hold, with
reference outputs, for klein's fp8 and int8_tensorwise loading (tests/test_fp8.cpp).

The independent writer of these fixtures: quantization with torch (float8_e4m3fn casts, int8 rounding),
BFL names from make_single_files.py's own table, the reference from diffusers' Flux2Transformer2DModel
run in float32 with the *dequantized* weights put back through diffusers' own converter
(convert_flux2_transformer_checkpoint_to_diffusers). Files written to tests/data/fp8/:

    tiny-flux2-bfl-fp8.safetensors     BFL layout: every block linear F8_E4M3 with 0-dim float32
                                       `weight_scale` (= amax / 448, per tensor; the fused qkv has one)
                                       and `input_scale`; the other tensors as stored (bf16)
    tiny-flux2-comfy-mixed.safetensors ComfyUI "mixed": the double blocks' linears fp8 with
                                       `weight_scale` + a `comfy_quant` U8 JSON tensor per layer and the
                                       header `_quantization_metadata`; single blocks stay bf16
    tiny-flux2-int8.safetensors        ComfyUI int8_tensorwise: block linears I8, float32 `weight_scale`
                                       [out, 1] (amax / 127 per row; the single blocks' linear2 a scalar),
                                       `comfy_quant` {"format": "int8_tensorwise"}
    tiny-flux2-int8-convrot.safetensors   int8_tensorwise with convrot in groups of 16 (the tiny model's
                                       widths are 32, 96 and 128; real files use 256): each row of W is
                                       stored rotated, W·Hᵀ per group (H = the 4 × 4 seed's Kronecker
                                       square / 4), then quantized per row
    tiny-flux2-diffusers-fp8.safetensors  diffusers names, fp8 block linears with scalar scales
    inputs.npz-like .npy files:        hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids
    out_<file stem>.npy                the dequantized model's output on those inputs (float32)
    out_full.npy                       the unquantized model's output (for cosine / PSNR reports)
    e4m3_codes.npy                     torch's float8_e4m3fn value of each byte 0..255 (float32)

Usage (from the repository root, with the oracle venv of scripts/reference/README.md):
    /work/oracle/bin/python scripts/reference/make_fp8_files.py
Deterministic: a rerun gives identical files.
"""

import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from make_single_files import dit_to_bfl  # noqa: E402  (BFL names: the single-file writer's table)

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(REPO_ROOT, "tests", "data", "tiny", "transformer")
OUT = os.path.join(REPO_ROOT, "tests", "data", "fp8")
E4M3_MAX = 448.0


def fp8_quantize(w):
    """Per-tensor scale amax / 448 (float32), e4m3fn payload; returns (q, scale, dequantized f32)."""
    w = w.float()
    scale = (w.abs().max() / E4M3_MAX).reshape(())
    q = (w / scale).to(torch.float8_e4m3fn)
    return q, scale, q.float() * scale


def int8_quantize(w, per_row):
    """Symmetric int8, round half to even; scale amax / 127 per row ([out, 1]) or per tensor (0-dim)."""
    w = w.float()
    amax = w.abs().amax(dim=1, keepdim=True) if per_row else w.abs().max().reshape(())
    scale = amax / 127.0
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q, scale, q.float() * scale


def block_linear(name):
    return (name.startswith("double_blocks.") or name.startswith("single_blocks.")) and name.endswith(".weight") \
        and "norm" not in name


def comfy_quant(conf):
    return torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)


def main():
    from diffusers import Flux2Transformer2DModel
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    cfg = json.load(open(os.path.join(TINY, "config.json")))
    dit = load_file(os.path.join(TINY, "diffusion_pytorch_model.safetensors"))
    bfl = dit_to_bfl(dit, cfg["num_layers"], cfg["num_single_layers"])
    os.makedirs(OUT, exist_ok=True)

    files = {}  # stem -> (tensors to write, metadata, BFL-named float32 dequantized state dict or None)

    # (a) BFL fp8: every block linear, one scale per (fused) tensor, a made-up but valid input_scale.
    t, deq = {}, {}
    for k, v in bfl.items():
        if block_linear(k):
            q, s, d = fp8_quantize(v)
            base = k[: -len("weight")]
            t[k], t[base + "weight_scale"], t[base + "input_scale"] = q, s, torch.tensor(0.5).reshape(())
            deq[k] = d
        else:
            t[k], deq[k] = v, v.float()
    files["tiny-flux2-bfl-fp8"] = (t, None, deq)

    # (b) ComfyUI mixed: double blocks fp8 with comfy_quant + header metadata, single blocks as stored.
    t, deq, layers = {}, {}, {}
    for k, v in bfl.items():
        if block_linear(k) and k.startswith("double_blocks."):
            q, s, d = fp8_quantize(v)
            base = k[: -len("weight")]
            t[k], t[base + "weight_scale"] = q, s
            t[base + "comfy_quant"] = comfy_quant({"format": "float8_e4m3fn"})
            layers[base[:-1]] = {"format": "float8_e4m3fn"}
            deq[k] = d
        else:
            t[k], deq[k] = v, v.float()
    meta = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}
    files["tiny-flux2-comfy-mixed"] = (t, meta, deq)

    # (c) ComfyUI int8_tensorwise: per-row scales, and one per-tensor scale (single blocks' linear2).
    t, deq = {}, {}
    for k, v in bfl.items():
        if block_linear(k):
            q, s, d = int8_quantize(v, per_row=not k.endswith("linear2.weight"))
            base = k[: -len("weight")]
            t[k], t[base + "weight_scale"] = q, s
            t[base + "comfy_quant"] = comfy_quant({"format": "int8_tensorwise"})
            deq[k] = d
        else:
            t[k], deq[k] = v, v.float()
    files["tiny-flux2-int8"] = (t, None, deq)

    # (c') int8 + convrot, groups of 16: H = kron(h4, h4) / 4, W_rot = W Hᵀ per group; dequantized
    # back with H (orthogonal): W ≈ (q · s) H per group.
    h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
    h16 = torch.kron(h4, h4) / 4.0
    t, deq = {}, {}
    for k, v in bfl.items():
        if block_linear(k):
            w = v.double()
            rot = (w.reshape(w.shape[0], -1, 16) @ h16.T).reshape(w.shape).float()
            q, s, d = int8_quantize(rot, per_row=True)
            base = k[: -len("weight")]
            t[k], t[base + "weight_scale"] = q, s
            t[base + "comfy_quant"] = comfy_quant({"format": "int8_tensorwise", "convrot": True,
                                                   "convrot_groupsize": 16})
            deq[k] = (d.double().reshape(w.shape[0], -1, 16) @ h16).reshape(w.shape).float()
        else:
            t[k], deq[k] = v, v.float()
    files["tiny-flux2-int8-convrot"] = (t, None, deq)

    # (d) diffusers names, fp8 block linears (scales per tensor, the q/k/v projections separately).
    t, deq_dit = {}, {}
    for k, v in dit.items():
        if ("transformer_blocks." in k) and k.endswith(".weight") and v.dim() == 2:
            q, s, d = fp8_quantize(v)
            t[k], t[k[: -len("weight")] + "weight_scale"] = q, s
            deq_dit[k] = d
        else:
            t[k], deq_dit[k] = v, v.float()
    files["tiny-flux2-diffusers-fp8"] = (t, None, None)

    # Fixed inputs: 4 x 4 latent tokens, 8 text tokens, ids as Flux2KleinPipeline prepares them.
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline
    g = torch.Generator().manual_seed(4242)
    lat = torch.randn(1, cfg["in_channels"], 4, 4, generator=g)
    hs = lat.flatten(2).transpose(1, 2).contiguous()
    ehs = torch.randn(1, 8, cfg["joint_attention_dim"], generator=g)
    timestep = torch.tensor([0.625], dtype=torch.float32)
    img_ids = Flux2KleinPipeline._prepare_latent_ids(lat)
    txt_ids = Flux2KleinPipeline._prepare_text_ids(ehs)

    def run(sd_diffusers):
        model = Flux2Transformer2DModel.from_config({k: v for k, v in cfg.items() if not k.startswith("_")})
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd_diffusers.items()}, strict=True)
        assert not missing and not unexpected
        model = model.float().eval()
        with torch.no_grad():
            return model(hidden_states=hs, encoder_hidden_states=ehs, timestep=timestep, img_ids=img_ids,
                         txt_ids=txt_ids, guidance=None, return_dict=False)[0]

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    np.save(os.path.join(OUT, "e4m3_codes.npy"), codes.numpy())
    np.save(os.path.join(OUT, "hidden_states.npy"), hs.numpy())
    np.save(os.path.join(OUT, "encoder_hidden_states.npy"), ehs.numpy())
    np.save(os.path.join(OUT, "timestep.npy"), timestep.numpy())
    np.save(os.path.join(OUT, "img_ids.npy"), img_ids.numpy().astype(np.int64))
    np.save(os.path.join(OUT, "txt_ids.npy"), txt_ids.numpy().astype(np.int64))
    full = run(dit)
    np.save(os.path.join(OUT, "out_full.npy"), full.numpy())
    for stem, (tensors, meta, deq) in files.items():
        save_file(tensors, os.path.join(OUT, stem + ".safetensors"), metadata=meta)
        sd = convert_flux2_transformer_checkpoint_to_diffusers(dict(deq)) if deq is not None else deq_dit
        out = run(sd)
        np.save(os.path.join(OUT, "out_" + stem + ".npy"), out.numpy())
        cos = torch.nn.functional.cosine_similarity(out.flatten(), full.flatten(), dim=0).item()
        print(f"{stem}: cosine vs full precision {cos:.6f}")


if __name__ == "__main__":
    main()
