#!/usr/bin/env python3
"""Write GGUF fixtures for klein's GGUF reader (tests/test_gguf.cpp) with the `gguf` package (gguf-py),
the independent writer, quantizer and dequantizer; the reference outputs come from diffusers run in
float32 with gguf-py's *dequantized* weights. Files written to tests/data/gguf/:

    types.gguf                 one tensor per type klein reads, [4, 512] each, named `w.<TYPE>`:
                               F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 quantized by gguf-py from
                               random floats; Q2_K..Q6_K random-but-valid blocks (gguf-py has no K-quant
                               quantizer): random bytes with finite fp16 d / dmin. Also a tensor with a
                               name of 80 bytes, and general.alignment = 64.
    deq_<TYPE>.npy             gguf-py's dequantization of w.<TYPE> (float32, [4, 512])
    tiny-flux2-comfy-<T>.gguf  the tiny transformer in BFL names, ComfyUI-GGUF's convention
                               (general.architecture = flux; 1-D and <= 1024-element tensors F32;
                               img_in / txt_in / time_in / final_layer F16, as its llama.cpp patch keeps
                               them; the rest <T>)
    tiny-flux2-sdcpp-<T>.gguf  stable-diffusion.cpp's convention: no metadata at all, the
                               `model.diffusion_model.` prefix, 1-D tensors F32, rows that are not
                               whole blocks F16, the rest <T>
    qwen3_llama_names.tsv      each tensor of the tiny text encoder: its transformers name and the llama.cpp
                               GGUF name gguf-py's tensor_mapping gives it (MODEL_ARCH.QWEN3), for the
                               name map (a GGUF of the tiny encoder would be ~5 MB: its 151936-token
                               embedding)
    ../../fuzz/corpus/gguf/*.gguf  the GGUF fuzz harness's seeds: every type in tiny tensors, metadata
                               of each value type (string and number arrays), an sd.cpp-style file
    out_<stem>.npy             diffusers' Flux2Transformer2DModel on the fp8 fixtures' inputs
                               (tests/data/fp8/*.npy) with the file's weights as gguf-py dequantizes them

Usage (from the repository root, with the oracle venv of scripts/reference/README.md):
    /work/oracle/bin/python scripts/reference/make_gguf_files.py
Deterministic: a rerun gives identical files.
"""

import json
import os
import sys

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(__file__))
from make_single_files import dit_to_bfl  # noqa: E402  (BFL names: the single-file writer's table)

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(REPO_ROOT, "tests", "data", "tiny", "transformer")
FP8 = os.path.join(REPO_ROOT, "tests", "data", "fp8")  # the fixed inputs are shared with the fp8 fixtures
OUT = os.path.join(REPO_ROOT, "tests", "data", "gguf")

# Byte offsets of the fp16 d (and dmin) of each K-quant block (ggml-common.h's block_q*_K).
K_SCALE_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
LONG_NAME = "a.tensor.name.longer.than.ggml.sixty.four.byte.limit.for.klein.reader.test.w"


def random_kquant(qtype, rows, cols, rng):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in K_SCALE_FIELDS[qtype]:
        h = rng.uniform(0.001, 0.05, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        raw[:, off:off + 2] = h
    return raw.reshape(rows, cols // block * size)


def write_types(rng):
    w = gguf.GGUFWriter(os.path.join(OUT, "types.gguf"), arch="klein-test")
    w.add_custom_alignment(64)
    rows, cols = 4, 512
    for qtype in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
                  T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
        if qtype in K_SCALE_FIELDS:
            q = random_kquant(qtype, rows, cols, rng)
        else:
            q = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
        deq = gguf.quants.dequantize(q, qtype).astype(np.float32)
        assert deq.shape == (rows, cols) and np.isfinite(deq).all()
        w.add_tensor(f"w.{qtype.name}", q, raw_dtype=qtype)
        np.save(os.path.join(OUT, f"deq_{qtype.name}.npy"), deq)
    w.add_tensor(LONG_NAME, np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_fuzz_seeds(rng):
    seeds = os.path.join(REPO_ROOT, "fuzz", "corpus", "gguf")
    os.makedirs(seeds, exist_ok=True)

    def save(name, w):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    w = gguf.GGUFWriter(os.path.join(seeds, "blocks32.gguf"), arch="flux")
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.F16, T.BF16, T.F32):
        q = gguf.quants.quantize(rng.standard_normal((2, 32)).astype(np.float32), qtype)
        w.add_tensor(f"double_blocks.0.{qtype.name}.weight", q, raw_dtype=qtype)
    save("blocks32", w)
    w = gguf.GGUFWriter(os.path.join(seeds, "kquants.gguf"), arch="flux")
    w.add_custom_alignment(64)
    for qtype in K_SCALE_FIELDS:
        w.add_tensor(f"w.{qtype.name}", random_kquant(qtype, 1, 256, rng), raw_dtype=qtype)
    save("kquants", w)
    w = gguf.GGUFWriter(os.path.join(seeds, "llama_meta.gguf"), arch="qwen3")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_token_list(["a", "b", "<|im_end|>"])
    w.add_token_scores([0.0, -1.0, -2.0])
    w.add_token_types([1, 1, 3])
    w.add_bool("klein.flag", True)
    w.add_int64("klein.i64", -5)
    w.add_float64("klein.f64", 0.5)
    w.add_array("klein.shape", [3, 4])
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(8).astype(np.float32))
    save("llama_meta", w)
    w = gguf.GGUFWriter(os.path.join(seeds, "sdcpp.gguf"), arch="flux")
    for kv in w.kv_data:
        kv.clear()
    w.add_tensor("model.diffusion_model.img_in.weight",
                 gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q4_0), raw_dtype=T.Q4_0)
    w.add_tensor("model.diffusion_model.img_in.bias", rng.standard_normal(4).astype(np.float32))
    save("sdcpp", w)


def write_qwen3_names():
    from safetensors import safe_open
    path = os.path.join(REPO_ROOT, "tests", "data", "tiny", "text_encoder", "model.safetensors")
    with safe_open(path, "pt") as f:
        keys = sorted(f.keys())
    te_cfg = json.load(open(os.path.join(os.path.dirname(path), "config.json")))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, te_cfg["num_hidden_layers"])
    keys.append("lm_head.weight")  # untied Qwen3s (8B) store it; llama.cpp calls it output.weight
    with open(os.path.join(OUT, "qwen3_llama_names.tsv"), "w") as out:
        for k in keys:
            g = names.get_name(k, try_suffixes=(".weight", ".bias"))
            assert g, k
            out.write(f"{g}\t{k}\n")


def comfy_type(name, v, qtype):
    if v.dim() <= 1 or v.numel() <= 1024:
        return T.F32
    if name.split(".")[0] in ("img_in", "txt_in", "time_in", "final_layer", "guidance_in", "vector_in"):
        return T.F16
    return qtype


def sdcpp_type(name, v, qtype):
    # sd.cpp's model.cpp keeps a tensor whose rows are not whole blocks in F16 (txt_in: 48 columns).
    if v.dim() <= 1:
        return T.F32
    return qtype if v.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0 else T.F16


def write_dit(stem, bfl, qtype, flavor):
    """Writes the BFL-named state dict; returns it as gguf-py dequantizes it (BFL names, float32)."""
    w = gguf.GGUFWriter(os.path.join(OUT, stem + ".gguf"), arch="flux")
    if flavor == "sdcpp":  # stable-diffusion.cpp's convert writes no key-value pairs at all
        for kv in w.kv_data:
            kv.clear()
    else:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    prefix = "model.diffusion_model." if flavor == "sdcpp" else ""
    deq = {}
    for name, v in bfl.items():
        t = (comfy_type if flavor == "comfy" else sdcpp_type)(name, v, qtype)
        a = v.float().numpy()
        q = gguf.quants.quantize(a, t)
        w.add_tensor(prefix + name, q, raw_dtype=t)
        deq[name] = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(q, t).astype(np.float32)).reshape(a.shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq


def main():
    from diffusers import Flux2Transformer2DModel
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(43)
    write_types(rng)
    write_fuzz_seeds(rng)
    write_qwen3_names()

    cfg = json.load(open(os.path.join(TINY, "config.json")))
    dit = load_file(os.path.join(TINY, "diffusion_pytorch_model.safetensors"))
    bfl = dit_to_bfl(dit, cfg["num_layers"], cfg["num_single_layers"])

    hs = torch.from_numpy(np.load(os.path.join(FP8, "hidden_states.npy")))
    ehs = torch.from_numpy(np.load(os.path.join(FP8, "encoder_hidden_states.npy")))
    timestep = torch.from_numpy(np.load(os.path.join(FP8, "timestep.npy")))
    img_ids = torch.from_numpy(np.load(os.path.join(FP8, "img_ids.npy")))
    txt_ids = torch.from_numpy(np.load(os.path.join(FP8, "txt_ids.npy")))
    full = torch.from_numpy(np.load(os.path.join(FP8, "out_full.npy")))

    def run(sd_diffusers):
        model = Flux2Transformer2DModel.from_config({k: v for k, v in cfg.items() if not k.startswith("_")})
        missing, unexpected = model.load_state_dict(sd_diffusers, strict=True)
        assert not missing and not unexpected
        model = model.float().eval()
        with torch.no_grad():
            return model(hidden_states=hs, encoder_hidden_states=ehs, timestep=timestep, img_ids=img_ids,
                         txt_ids=txt_ids, guidance=None, return_dict=False)[0]

    for flavor, qtypes in (("comfy", (T.Q8_0, T.Q4_0, T.Q5_1, T.BF16)), ("sdcpp", (T.Q4_1, T.Q5_0))):
        for qtype in qtypes:
            stem = f"tiny-flux2-{flavor}-{qtype.name}"
            deq = write_dit(stem, bfl, qtype, flavor)
            out = run(convert_flux2_transformer_checkpoint_to_diffusers(dict(deq)))
            np.save(os.path.join(OUT, "out_" + stem + ".npy"), out.numpy())
            cos = torch.nn.functional.cosine_similarity(out.flatten(), full.flatten(), dim=0).item()
            print(f"{stem}: cosine vs full precision {cos:.6f}")


if __name__ == "__main__":
    main()
