#!/usr/bin/env python3
"""Checks the GGUF files `klein quantize --type gguf:<T> --flavor comfy|sdcpp` writes from the tiny
model against files built independently here, and records their SHA-256 for the C++ test
(tests/test_gguf_write.cpp, GgufQuantizeCli.TinyTransformerFilesEqualTheIndependentBuild).

The independent build: the tiny transformer's safetensors (torch), renamed to BFL names by
make_single_files.dit_to_bfl (qkv concatenated, the final modulation's halves swapped), typed by the
producers' rules restated here from their code (ComfyUI-GGUF tools/convert.py + tools/lcpp.patch;
stable-diffusion.cpp model_loader.cpp tensor_should_be_converted), quantized with ggml's own
ggml-quants.c reference quantizers (built as make_gguf_quant_fixtures.py builds them), F16 by numpy,
BF16 by gguf-py, and written with gguf-py's GGUFWriter (alignment 32, sorted names; comfy:
general.architecture flux, general.quantization_version 2, general.file_type; sdcpp: no keys).
klein's file must equal it byte for byte. gguf-py's GGUFReader then reads klein's file and
dequantizes every tensor (gguf.quants.dequantize) as a load check.

Writes tests/data/gguf/written_tiny.json: {"<flavor> <TYPE>": sha256 of the file}.

Usage (from the repository root, klein built in build/):
    /work/oracle/bin/python scripts/reference/check_gguf_written.py --ggml /path/to/ggml [--klein build/klein]
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(__file__))
from make_single_files import dit_to_bfl  # noqa: E402
from make_gguf_quant_fixtures import QTYPES, build_ggml, ggml_quantize  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(REPO_ROOT, "tests", "data", "tiny")
OUT = os.path.join(REPO_ROOT, "tests", "data", "gguf")

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32"]
# llama.cpp's LLAMA_FTYPE_MOSTLY_* (K-quants as their _S mixes).
FTYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K": 11,
         "Q4_K": 14, "Q5_K": 16, "Q6_K": 18, "BF16": 32}
FLUX_KEPT = ("txt_in.", "img_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer.")


def block(t):
    return gguf.GGML_QUANT_SIZES[t][0]


def comfy_type(name, v, target):
    # tools/convert.py: bf16 stays BF16, anything else F16; from f32 / bf16, 1-D and <= 1024 elements F32.
    stage = T.BF16 if v.dtype == torch.bfloat16 else T.F16
    if v.dtype in (torch.float32, torch.bfloat16) and (v.dim() == 1 or v.numel() <= 1024):
        stage = T.F32
    # lcpp.patch llama-quantize: names ending in "weight" with >= 2 dims, FLUX's skip list, F16 fallback.
    if not (name.endswith("weight") and v.dim() >= 2) or any(k in name for k in FLUX_KEPT):
        return stage
    return T.F16 if block(target) > 1 and v.shape[-1] % block(target) else target


def sdcpp_type(name, v, target):
    src = {torch.float32: T.F32, torch.float16: T.F16, torch.bfloat16: T.BF16}[v.dtype]
    if block(target) > 1 and v.shape[-1] % block(target):
        return src
    if name.endswith((".bias", ".scale", ".weight_scale")) or any(k in name for k in FLUX_KEPT) or "embedding" in name:
        return src
    return target


def encode(lib, a, t):
    """float32 array -> GGUF bytes of type t (ggml's reference quantizers for block types)."""
    if t == T.F32:
        return a.astype(np.float32)
    if t == T.F16:
        return a.astype(np.float16)
    if t == T.BF16:
        return gguf.quants.quantize(a, T.BF16)
    fn = dict(QTYPES)[t]
    return ggml_quantize(lib, fn, t, a.reshape(-1, a.shape[-1]))


def build_expected(lib, bfl, target, flavor, path):
    w = gguf.GGUFWriter(path, arch="flux")
    if flavor == "sdcpp":
        for kv in w.kv_data:
            kv.clear()
    else:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_file_type(FTYPE[target.name])
    prefix = "model.diffusion_model." if flavor == "sdcpp" else ""
    for name in sorted(bfl):
        v = bfl[name]
        t = (comfy_type if flavor == "comfy" else sdcpp_type)(name, v, target)
        data = encode(lib, v.float().numpy(), t)
        w.add_tensor(prefix + name, data, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ggml", required=True)
    ap.add_argument("--klein", default=os.path.join(REPO_ROOT, "build", "klein"))
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(TINY, "transformer", "config.json")))
    dit = load_file(os.path.join(TINY, "transformer", "diffusion_pytorch_model.safetensors"))
    bfl = dit_to_bfl(dit, cfg["num_layers"], cfg["num_single_layers"])
    digests = {}
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        lib = build_ggml(args.ggml, tmp)
        for flavor in ("comfy", "sdcpp"):
            for tname in TYPES:
                target = T[tname]
                ours = os.path.join(tmp, f"klein-{flavor}-{tname}.gguf")
                ref = os.path.join(tmp, f"ref-{flavor}-{tname}.gguf")
                subprocess.run([args.klein, "quantize", "-q", "--model", TINY, "--type", f"gguf:{tname}", "--flavor",
                                flavor, "-o", ours, "--threads", "2"], check=True)
                build_expected(lib, bfl, target, flavor, ref)
                same = open(ours, "rb").read() == open(ref, "rb").read()
                # gguf-py reads klein's file and dequantizes every tensor.
                r = gguf.GGUFReader(ours)
                for t in r.tensors:
                    gguf.quants.dequantize(t.data, t.tensor_type)
                types = sorted({t.tensor_type.name for t in r.tensors})
                print(f"{flavor:5} {tname:5}: {'identical' if same else 'DIFFERENT'} to the independent build; "
                      f"{len(r.tensors)} tensors ({', '.join(types)})")
                failed += not same
                digests[f"{flavor} {tname}"] = sha256(ref)
        # The tiny model's rows (32 / 96 / 128 columns) are never whole K-quant blocks: a wider
        # random transformer (D 256, one block of each kind, bf16, BFL names, one file) makes
        # every K-quant appear in both flavors. Checked the same way, not recorded (7 MB).
        torch.manual_seed(43)
        from diffusers import Flux2Transformer2DModel
        wide = Flux2Transformer2DModel(patch_size=1, in_channels=128, num_layers=1, num_single_layers=1,
                                       attention_head_dim=128, num_attention_heads=2, joint_attention_dim=256,
                                       timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32),
                                       rope_theta=2000, eps=1e-6, guidance_embeds=False)
        wsd = {k: (v * 0.05 if v.dim() > 1 else v).to(torch.bfloat16).contiguous() for k, v in wide.state_dict().items()}
        wbfl = dit_to_bfl(wsd, 1, 1)
        wide_file = os.path.join(tmp, "wide-bfl.safetensors")
        from safetensors.torch import save_file
        save_file(wbfl, wide_file)
        for flavor in ("comfy", "sdcpp"):
            for tname in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0"):
                ours = os.path.join(tmp, f"wide-{flavor}-{tname}.gguf")
                ref = os.path.join(tmp, f"wide-ref-{flavor}-{tname}.gguf")
                subprocess.run([args.klein, "quantize", "-q", "--diffusion-model", wide_file, "--type", f"gguf:{tname}",
                                "--flavor", flavor, "-o", ours, "--threads", "2"], check=True)
                build_expected(lib, wbfl, T[tname], flavor, ref)
                same = open(ours, "rb").read() == open(ref, "rb").read()
                r = gguf.GGUFReader(ours)
                for t in r.tensors:
                    gguf.quants.dequantize(t.data, t.tensor_type)
                counts = {}
                for t in r.tensors:
                    counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
                print(f"wide {flavor:5} {tname:5}: {'identical' if same else 'DIFFERENT'} to the independent build; "
                      f"{len(r.tensors)} tensors {counts}")
                failed += not same
    if failed:
        sys.exit(f"{failed} files differ")
    with open(os.path.join(OUT, "written_tiny.json"), "w") as f:
        json.dump(digests, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
