#!/usr/bin/env python3
"""Writes the full-size random 4B transformer (a klein-make_random_model folder) as the single files users
hold, for bench/load_forms.sh: BFL names (flux-2-klein-4b.safetensors), the same under ComfyUI's
`model.diffusion_model.` prefix, and BFL's fp8 layout (every block linear F8_E4M3 with a 0-dim float32
`weight_scale` = amax / 448 and `input_scale`, the rest bf16). Names and quantization come from
scripts/reference/make_single_files.py and make_fp8_files.py (the fixtures' writers).

Files are written tensor by tensor (header, then each tensor's bytes), so memory stays at the model's
size once, not twice as safetensors' save_file needs.

    /work/oracle/bin/python bench/make_load_forms.py MODEL_DIR OUT_DIR
"""
import json
import os
import struct
import sys

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "reference"))
from make_single_files import dit_to_bfl  # noqa: E402
from make_fp8_files import block_linear, fp8_quantize  # noqa: E402

DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16", torch.float8_e4m3fn: "F8_E4M3"}


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for k, t in tensors.items():
        n = t.numel() * t.element_size()
        header[k] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t in tensors.values():
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    os.replace(tmp, path)


def main():
    model, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    tdir = os.path.join(model, "transformer")
    cfg = json.load(open(os.path.join(tdir, "config.json")))
    sd = {}
    for f in sorted(os.listdir(tdir)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(tdir, f), framework="pt") as st:
                for k in st.keys():
                    sd[k] = st.get_tensor(k)
    bfl = dit_to_bfl(sd, cfg["num_layers"], cfg["num_single_layers"])
    del sd
    write_safetensors(os.path.join(out, "flux-2-klein-4b.safetensors"), bfl)
    write_safetensors(os.path.join(out, "flux-2-klein-4b-comfy.safetensors"),
                      {"model.diffusion_model." + k: v for k, v in bfl.items()})
    fp8 = {}
    for k, v in bfl.items():
        if block_linear(k):
            q, scale, _ = fp8_quantize(v)
            fp8[k] = q
            fp8[k[: -len("weight")] + "weight_scale"] = scale.float()
            fp8[k[: -len("weight")] + "input_scale"] = torch.ones((), dtype=torch.float32)
        else:
            fp8[k] = v
    del bfl
    write_safetensors(os.path.join(out, "flux-2-klein-4b-fp8.safetensors"), fp8)


if __name__ == "__main__":
    main()
