#!/usr/bin/env python3
"""Quantized references: what klein.cpp must compute for a `klein quantize`d model under
`--precision fast`, from the REAL diffusers / transformers pipeline run in float32 with klein's
quantization applied in Python.

For each case the script
  1. runs `klein quantize --type q8|q4` on the tiny model (q4: the tiny_q4 variant, whose layers
     have in_features that are multiples of 64; see make_tiny_model.py --variant q4),
  2. re-derives every quantized tensor from the bf16 weights with the recipes of
     src/core/quantize.h (written here in numpy) and asserts klein wrote exactly those bytes,
  3. loads the original folder with Flux2KleinPipeline.from_pretrained(dtype=float32) and replaces
     the forward of every nn.Linear (text encoder, transformer, VAE) by the arithmetic klein's
     fast kernels define (src/kernels/kernels.h, src/kernels/ref/linear_lowp_ref.cpp):
       Q8_ROW weight : W8A8 — x quantized per token (s = amax/127, round half to even, clamp
                       ±127), exact int32 sums, y = (float(acc)·s_x)·s_w + bias, each step float32
       Q4_G64 weight : "w4a8": x quantized as above, y = s_x·Σ_g(s_g·A_g + o_g·X_g) + bias (double)
                       "deq":  float32 linear with the dequantized weight o + s·q (CPUs without
                               AVX512_VNNI compute Q4_G64 with the exact kernels)
       other weights : "bf16": x and W rounded to bf16 (RNE), products summed (double), + bias —
                               the AVX512_BF16 GEMM
                       "f32":  the float32 linear (CPUs without AVX512_BF16)
     and, in the "bf16" cases, the forward of every VAE nn.Conv2d by the AVX512_BF16 conv's
     arithmetic (ref::conv2d_bf16): the conv's input (after diffusers' SiLU / upsampling / padding,
     which klein fuses into the conv) and its weight rounded to bf16, double sums, + bias — except
     convs with ≤ 6 output channels and stride 1 (the decoder's conv_out), which klein computes
     in float32 on every CPU (src/kernels/cpu/conv2d_avx512_common.h); and every attention
     (torch's scaled_dot_product_attention, which diffusers and transformers call) by the
     AVX512_BF16 attention's (ref::attention_bf16): q·scale·log2(e) and k rounded to bf16, scores
     in double, an online softmax over key blocks of 128 (p = 2^(s − running max)),
     out = Σ bf16(p)·bf16(v) / Σ p
  4. runs the pipeline (prompt, 64x64, 4 steps, seed 42) and saves each component boundary and
     the inputs the C++ test feeds to single components (noise, te_hidden_in, timesteps),
  5. measures, for the manifest, how far the reference moves when the inputs of its rounding
     linears change in the last bit ("envelope": the rounding flips any other float32
     implementation must be allowed) and how far it is from the same computation without
     quantization ("rel_to_unquantized": what a test must be able to tell apart), each
     component fed the reference's input as the C++ test feeds klein.

Which arithmetic a CPU gets is decided by klein's kernel selection (src/kernels/registry.cpp),
so there is one case per combination a CPU can have: the C++ test (tests/test_quant_ref.cpp)
asks its KernelSet which kernels Q4_G64 and BF16 linears get and picks the matching case.

Output: tests/data/ref_quant/<case>/*.npy and tests/data/ref_quant/manifest.json (layouts:
scripts/reference/README.md §7). Deterministic: a rerun writes the same bytes.

Usage (repository root, the oracle venv, a built klein):
    python scripts/reference/dump_quant_reference.py [--klein build/klein]
    python scripts/reference/dump_quant_reference.py --compare-klein   # also klein end to end, errors printed
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("DIFFUSERS_ATTN_BACKEND", "native")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import diffusers  # noqa: E402
import transformers  # noqa: E402
from diffusers import Flux2KleinPipeline  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO_ROOT, "tests", "data")
DEFAULT_OUT = os.path.join(DATA, "ref_quant")
CAT = "A cat holding a sign that says hello world"

# One case per (type, arithmetic of Q4_G64 linears, arithmetic of float linears) a CPU can get.
# q8 has no Q4_G64 layers. "deq" + "bf16" would need AVX512_BF16 without AVX512_VNNI, which no
# CPU has (the C++ test says so by name if one appears).
RUN = dict(prompt=CAT, width=64, height=64, steps=4, seed=42)
CASES = [
    dict(name="q8_w8a8_f32", type="q8", variant=None, q4="none", float="f32"),
    dict(name="q8_w8a8_bf16", type="q8", variant=None, q4="none", float="bf16"),
    dict(name="q4_deq_f32", type="q4", variant="q4", q4="deq", float="f32"),
    dict(name="q4_w4a8_f32", type="q4", variant="q4", q4="w4a8", float="f32"),
    dict(name="q4_w4a8_bf16", type="q4", variant="q4", q4="w4a8", float="bf16"),
]
QUANTIZED_COMPONENTS = ("text_encoder", "transformer")


# --------------------------------------------------------------------------------------------
# safetensors, read by hand: klein writes I8 / U32 tensors, and the exact bytes are what we pin
# --------------------------------------------------------------------------------------------
def read_safetensors(folder):
    """{name: (dtype, shape, raw bytes)} of every *.safetensors file in folder."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, f), "rb") as fh:
            data = fh.read()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        base = 8 + n
        for name, e in header.items():
            if name == "__metadata__":
                continue
            a, b = e["data_offsets"]
            out[name] = (e["dtype"], tuple(e["shape"]), data[base + a:base + b])
    return out


def bf16_bytes_to_f32(raw, shape):
    u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32).reshape(shape)


def f32_to_bf16_bits(x):
    """Round float32 to bf16 with round-to-nearest-even (as torch's .to(bfloat16)); finite x."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def round_bf16(x):
    return (f32_to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def fnv1a64(raw):
    """FNV-1a 64 of bytes (the C++ test computes the same over klein quantize's output)."""
    h = 0xCBF29CE484222325
    for b in raw:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


# --------------------------------------------------------------------------------------------
# the recipes of src/core/quantize.h (numpy float32: every operation one IEEE op, no FMA)
# --------------------------------------------------------------------------------------------
def quantize_q8(w):
    """w [N, K] f32 -> q [N, K] int8, scale [N] f32."""
    s = np.abs(w).max(axis=1) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s[:, None] > 0, np.clip(np.rint(w / s[:, None]), -127, 127), 0)
    return q.astype(np.int8), s.astype(np.float32)


def quantize_q4(w):
    """w [N, K] f32 (K % 64 == 0) -> packed [N, K/2] uint8, scales/biases [N, K/64] f32 (MLX)."""
    N, K = w.shape
    g = w.reshape(N, K // 64, 64)
    lo, hi = g.min(axis=2), g.max(axis=2)
    flip = np.abs(lo) > np.abs(hi)
    scale = np.maximum((hi - lo) / np.float32(15), np.float32(1e-7))
    scale = np.where(flip, scale, -scale).astype(np.float32)
    edge = np.where(flip, lo, hi).astype(np.float32)
    q0 = np.rint(edge / scale)
    bias = np.zeros_like(scale)
    nz = q0 != 0
    scale = np.where(nz, edge / np.where(nz, q0, 1).astype(np.float32), scale).astype(np.float32)
    bias = np.where(nz, edge, bias).astype(np.float32)
    q = np.clip(np.rint((g - bias[..., None]) / scale[..., None]), 0, 15).astype(np.uint8).reshape(N, K)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    return packed, scale, bias


# --------------------------------------------------------------------------------------------
# the fast kernels' arithmetic (src/kernels/ref/linear_lowp_ref.cpp), on numpy float32
# --------------------------------------------------------------------------------------------
def quantize_act(x):
    """x [M, K] f32 -> q [M, K] (integers as float64), s [M] f32: ref::quantize_row_int8."""
    s = np.abs(x).max(axis=1) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s[:, None] > 0, np.clip(np.rint(x / s[:, None]), -127, 127), 0)
    return q.astype(np.float64), s.astype(np.float32)


def linear_w8a8(x, qw, sw, bias):
    q, sx = quantize_act(x)
    acc = (q @ qw.astype(np.float64).T).astype(np.float32)  # exact integers, then float(acc) RNE
    y = (acc * sx[:, None]) * sw[None, :]  # two float32 products, in this order
    return y + bias[None, :] if bias is not None else y


def linear_w4a8(x, nib, sg, og, bias):
    """nib [N, K] 0..15, sg/og [N, G] f32 (the stored bf16 values): ref::linear_w4a8."""
    q, sx = quantize_act(x)
    M, K = q.shape
    N, G = sg.shape
    qg = q.reshape(M, G, 64)
    A = np.einsum("mgk,ngk->mng", qg, nib.astype(np.float64).reshape(N, G, 64))  # exact
    X = qg.sum(axis=2)  # [M, G]
    acc = (A * sg[None].astype(np.float64)).sum(axis=2) + X @ og.astype(np.float64).T
    y = sx.astype(np.float64)[:, None] * acc
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
    return y.astype(np.float32)


def linear_bf16(x, w, bias):
    y = round_bf16(x).astype(np.float64) @ round_bf16(w).astype(np.float64).T
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
    return y.astype(np.float32)


# Rounding sensitivity (the manifest's "envelope"): with a seed set, every input element x of a
# rounding linear (int8 or bf16 activations) becomes x·(1 + eps·u), u in [-1, 1) a hash of x's bits
# and the seed — a last-bit change such as klein's float32 norms, attention and GEMMs make, and
# the same for equal values (the 500 pad rows of the text encoder share their first input).
PERTURB = {"seed": None, "eps": 2.0 ** -23}


def perturb(x):
    b = x.view(np.uint32).astype(np.uint64)
    h = b * np.uint64(0x9E3779B97F4A7C15) + np.uint64(PERTURB["seed"] * 0xBF58476D1CE4E5B9 % 2**64)
    h ^= h >> np.uint64(29)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(32)
    u = (h >> np.uint64(11)).astype(np.float64) / 2.0 ** 53 * 2 - 1
    return (x.astype(np.float64) * (1 + PERTURB["eps"] * u)).astype(np.float32)


class KleinLinear(torch.nn.Module):
    """An nn.Linear computed as one of klein's kernels (kind: w8a8, w4a8, bf16, f32)."""

    def __init__(self, lin, kind, w_f32, **q):
        super().__init__()
        self.kind, self.q = kind, q
        self.w = w_f32  # numpy [N, K] f32: the stored weight (Q4_G64: dequantized); unused by W8A8 / W4A8
        self.bias = None if lin.bias is None else lin.bias.detach().float().numpy()
        self.wt = torch.from_numpy(w_f32)
        self.bt = None if lin.bias is None else lin.bias.detach().float()

    def forward(self, x):
        if self.kind == "f32":
            return torch.nn.functional.linear(x, self.wt, self.bt)
        shape = x.shape
        x2 = x.detach().float().reshape(-1, shape[-1]).contiguous().numpy()
        if PERTURB["seed"] is not None:
            x2 = perturb(x2)
        if self.kind == "w8a8":
            y = linear_w8a8(x2, self.q["qw"], self.q["sw"], self.bias)
        elif self.kind == "w4a8":
            y = linear_w4a8(x2, self.q["nib"], self.q["sg"], self.q["og"], self.bias)
        else:
            y = linear_bf16(x2, self.w, self.bias)
        return torch.from_numpy(np.ascontiguousarray(y)).reshape(*shape[:-1], y.shape[-1])


class KleinConv2d(torch.nn.Module):
    """An nn.Conv2d computed as klein's AVX512_BF16 conv: input and weight rounded to bf16, float64 sums."""

    def __init__(self, conv):
        super().__init__()
        self.conv = conv
        self.w = torch.from_numpy(round_bf16(conv.weight.detach().float().numpy())).double()
        self.b = None if conv.bias is None else conv.bias.detach().double()

    def forward(self, x):
        c = self.conv
        x2 = x.detach().float().contiguous().numpy()
        if PERTURB["seed"] is not None:
            x2 = perturb(x2)
        xr = torch.from_numpy(round_bf16(x2)).double()
        y = torch.nn.functional.conv2d(xr, self.w, self.b, c.stride, c.padding, c.dilation, c.groups)
        return y.float()


LOG2E = 1.4426950408889634
ATTN_KEY_BLOCK = 128  # kernels::ref::kAttnBf16KeyBlock
SDPA = {"orig": torch.nn.functional.scaled_dot_product_attention, "bf16": False}


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """torch's scaled_dot_product_attention, or klein's bf16 attention while SDPA["bf16"] is set."""
    if not SDPA["bf16"]:
        return SDPA["orig"](query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
    assert dropout_p == 0.0
    q, k, v = (t.detach().float().contiguous().numpy() for t in (query, key, value))
    if PERTURB["seed"] is not None:  # the attention's operands are rounded too
        q, k, v = perturb(q), perturb(k), perturb(v)
    hq, hk = q.shape[-3], k.shape[-3]
    if hk != hq:  # grouped-query attention: each kv head serves hq / hk query heads
        k, v = np.repeat(k, hq // hk, axis=-3), np.repeat(v, hq // hk, axis=-3)
    sc = np.float32(scale if scale is not None else 1.0 / np.sqrt(q.shape[-1]))
    mul = np.float32(sc * np.float32(LOG2E))  # klein: scale · log2(e) in float32, then q · mul
    s = round_bf16(q * mul).astype(np.float64) @ np.swapaxes(round_bf16(k).astype(np.float64), -1, -2)
    keep = np.ones(s.shape, dtype=bool)
    if is_causal:
        keep &= np.tril(np.ones(s.shape[-2:], dtype=bool))
    if attn_mask is not None:
        m = attn_mask.detach().cpu().numpy()
        if m.dtype != np.bool_:  # additive: 0 where visible, a large negative value elsewhere
            assert np.all((m == 0) | (m < -1e30)), "additive attention masks other than 0 / -inf"
            m = m == 0
        keep = keep & m
    s = np.where(keep, s, -np.inf)
    # The kernel's online softmax over key blocks (ref::attention_bf16): p against the running max.
    vb = round_bf16(v).astype(np.float64)
    m = np.full(s.shape[:-1] + (1,), -np.inf)
    l = np.zeros_like(m)
    o = np.zeros(s.shape[:-1] + (v.shape[-1],))
    for j0 in range(0, s.shape[-1], ATTN_KEY_BLOCK):
        sb = s[..., j0:j0 + ATTN_KEY_BLOCK]
        mnew = np.maximum(m, sb.max(axis=-1, keepdims=True))
        seen = np.isfinite(mnew)  # rows with a visible key so far
        corr = np.where(np.isfinite(m), np.exp2(m - np.where(seen, mnew, 0)), 0)
        p = np.where(np.isfinite(sb), np.exp2(sb - np.where(seen, mnew, 0)), 0)
        l = l * corr + p.sum(axis=-1, keepdims=True)
        o = o * corr + round_bf16(p.astype(np.float32)).astype(np.float64) @ vb[..., j0:j0 + ATTN_KEY_BLOCK, :]
        m = np.where(seen, mnew, m)
    o = np.where(l > 0, o / np.where(l > 0, l, 1), 0)  # no visible key: zeros, as klein
    return torch.from_numpy(o.astype(np.float32))


torch.nn.functional.scaled_dot_product_attention = sdpa


def patch_convs(vae, case):
    """In the bf16 cases: every VAE conv that klein's fast kernels compute with bf16 operands."""
    n = 0
    if case["float"] != "bf16":
        return n
    for name, conv in list(vae.named_modules()):
        if not isinstance(conv, torch.nn.Conv2d):
            continue
        assert conv.padding_mode == "zeros" and conv.dilation == (1, 1) and conv.groups == 1, name
        if conv.out_channels <= 6 and conv.stride == (1, 1):
            continue  # klein's direct path: float32
        set_module(vae, name, KleinConv2d(conv))
        n += 1
    return n


def set_module(root, name, new):
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


def patch_component(model, comp, qfolder, case, orig):
    """Replaces every nn.Linear of `model` by its klein arithmetic; checks klein quantize's
    output against the recipes. Returns {tensor: fnv1a64} of the quantized tensors and counts."""
    qt = read_safetensors(qfolder) if qfolder else {}
    hashes, counts = {}, {}
    for name, lin in list(model.named_modules()):
        if not isinstance(lin, torch.nn.Linear) or name == "lm_head":
            continue  # lm_head: the text encoder's logits, which prompt embedding never uses
        key = name + ".weight"
        w = lin.weight.detach().float().numpy()
        kind, extra = ("bf16" if case["float"] == "bf16" else "f32"), {}
        stored = qt.get(key)
        if stored is not None and stored[0] == "I8":
            q, s = quantize_q8(w)
            assert stored[2] == q.tobytes(), f"{comp}/{key}: klein's int8 differ from the recipe"
            sraw = qt[key + "_scale"][2]
            assert sraw == s.astype("<f4").tobytes(), f"{comp}/{key}_scale differs from the recipe"
            hashes[key], hashes[key + "_scale"] = fnv1a64(stored[2]), fnv1a64(sraw)
            kind, extra = "w8a8", dict(qw=q, sw=s)
        elif stored is not None and stored[0] == "U32":
            packed, sc, bi = quantize_q4(w)
            base = key[: -len("weight")]
            assert stored[2] == packed.tobytes(), f"{comp}/{key}: klein's nibbles differ from the recipe"
            s_raw, b_raw = qt[base + "scales"][2], qt[base + "biases"][2]
            assert s_raw == f32_to_bf16_bits(sc).tobytes(), f"{comp}/{base}scales differ from the recipe"
            assert b_raw == f32_to_bf16_bits(bi).tobytes(), f"{comp}/{base}biases differ from the recipe"
            for k, raw in ((key, stored[2]), (base + "scales", s_raw), (base + "biases", b_raw)):
                hashes[k] = fnv1a64(raw)
            N, K = w.shape
            nib = np.stack([packed & 0xF, packed >> 4], axis=2).reshape(N, K)
            sg, og = bf16_bytes_to_f32(s_raw, sc.shape), bf16_bytes_to_f32(b_raw, bi.shape)
            # dequantisation o + s·q: a float32 product, then a float32 sum (core/format.cpp)
            w = (np.repeat(og, 64, axis=1) + np.repeat(sg, 64, axis=1) * nib.astype(np.float32)).astype(np.float32)
            kind = "w4a8" if case["q4"] == "w4a8" else "f32"
            extra = dict(nib=nib, sg=sg, og=og)
        elif stored is not None:
            assert stored[2] == orig[key][2], f"{comp}/{key}: kept but not byte-identical"
        elif qfolder and key in orig:
            raise AssertionError(f"{comp}/{key}: missing from klein's output")
        counts[kind] = counts.get(kind, 0) + 1
        set_module(model, name, KleinLinear(lin, kind, np.ascontiguousarray(w, dtype=np.float32), **extra))
    return hashes, counts


# --------------------------------------------------------------------------------------------
# model folders and the pipeline run
# --------------------------------------------------------------------------------------------
def assemble(variant, tmp):
    """The model folder of a case: tests/data/tiny, or tiny with the variant's components."""
    if not variant:
        return os.path.join(DATA, "tiny")
    d = os.path.join(tmp, "tiny_" + variant)
    if not os.path.exists(d):
        shutil.copytree(os.path.join(DATA, "tiny"), d)
        for comp in QUANTIZED_COMPONENTS:
            shutil.rmtree(os.path.join(d, comp))
            shutil.copytree(os.path.join(DATA, "tiny_" + variant, comp), os.path.join(d, comp))
    return d


def quantize(klein, model, qtype, tmp):
    out = os.path.join(tmp, os.path.basename(model) + "_" + qtype)
    if not os.path.exists(out):
        subprocess.run([klein, "quantize", "-q", "--model", model, "--type", qtype, "-o", out], check=True)
    return out


TE_LAYERS = (8, 17, 26)  # their outputs are the taps hidden_states[9, 18, 27] that prompt_embeds holds
STEPS = ["velocity_step%d" % k for k in range(1, RUN["steps"] + 1)] + \
        ["latents_step%d" % k for k in range(1, RUN["steps"] + 1)]


def run_pipeline(pipe, prompt_embeds=None):
    """The pipeline's own run. Returns the boundaries klein dumps, named as klein names them, and
    the inputs the C++ test feeds back to single components: noise [1,128,h,w], te_hidden_in
    [3, L, hidden] (hidden_states[8, 17, 26]: the inputs of the layers whose outputs prompt_embeds
    holds) and timesteps [steps] (the transformer's `timestep` argument, t/1000). With
    prompt_embeds (numpy) the text encoder is skipped and those embeddings are denoised."""
    rec = {"velocity": [], "steps": [], "timestep": []}
    orig_decode, orig_prepare = pipe.vae.decode, pipe.prepare_latents

    def te_hook(mod, args, kwargs, output):
        rec["hidden"] = output.hidden_states

    def decode(z, *a, **k):
        out = orig_decode(z, *a, **k)
        rec["latents_final"] = z.clone()
        rec["image"] = (out[0] if isinstance(out, tuple) else out.sample).clone()
        return out

    def prepare_latents(*a, **k):
        out = orig_prepare(*a, **k)
        rec["latents0"], rec["ids"] = out[0].clone(), out[1].clone()
        return out

    def tr_hook(mod, args, kwargs, output):
        rec["velocity"].append(output[0].clone())
        rec["timestep"].append(kwargs["timestep"].clone())

    def cb(p, i, t, kw):
        rec["steps"].append(kw["latents"].clone())
        return {}

    pipe.vae.decode, pipe.prepare_latents = decode, prepare_latents
    hooks = [pipe.transformer.register_forward_hook(tr_hook, with_kwargs=True),
             pipe.text_encoder.register_forward_hook(te_hook, with_kwargs=True)]
    try:
        with torch.no_grad():
            pe = None if prompt_embeds is None else torch.from_numpy(prompt_embeds)
            pipe(prompt=None if pe is not None else RUN["prompt"], prompt_embeds=pe, height=RUN["height"],
                 width=RUN["width"], num_inference_steps=RUN["steps"], guidance_scale=1.0,
                 generator=torch.Generator("cpu").manual_seed(RUN["seed"]), output_type="np",
                 callback_on_step_end=cb, callback_on_step_end_tensor_inputs=["latents"])
    finally:
        del pipe.vae.decode, pipe.prepare_latents
        for hd in hooks:
            hd.remove()
    h, w = RUN["height"] // 16, RUN["width"] // 16

    def unpack(t):  # (1, h*w, 128) tokens -> (1, 128, h, w), the pipeline's own unpacking
        return pipe._unpack_latents_with_ids(t[:, : h * w], rec["ids"], h, w)

    out = {"noise": unpack(rec["latents0"]),
           "timesteps": torch.cat([t.float().reshape(1) for t in rec["timestep"]])}
    if prompt_embeds is None:
        out["prompt_embeds"] = torch.cat([rec["hidden"][k + 1] for k in TE_LAYERS], dim=-1)
        out["te_hidden_in"] = torch.cat([rec["hidden"][k] for k in TE_LAYERS], dim=0)
    for k in range(RUN["steps"]):
        out[f"velocity_step{k + 1}"] = unpack(rec["velocity"][k])
        out[f"latents_step{k + 1}"] = unpack(rec["steps"][k])
    out["latents_final"] = rec["latents_final"]
    out["image"] = rec["image"]
    return {k: v.detach().float().numpy() for k, v in out.items()}


def dit_step(pipe, latents, prompt_embeds, timestep):
    """One transformer call on unpacked latents [1,128,h,w]: the velocity [1,128,h,w]."""
    lat, pe = torch.from_numpy(latents), torch.from_numpy(prompt_embeds)
    ids = pipe._prepare_latent_ids(lat)
    with torch.no_grad():
        v = pipe.transformer(hidden_states=pipe._pack_latents(lat), encoder_hidden_states=pe,
                             timestep=torch.tensor([timestep], dtype=torch.float32), img_ids=ids,
                             txt_ids=pipe._prepare_text_ids(pe), guidance=None, return_dict=False)[0]
    return pipe._unpack_latents_with_ids(v, ids, lat.shape[2], lat.shape[3]).numpy()


def teacher_forced(pipe, ref):
    """Each component fed the reference's input, as the C++ test feeds klein: the text encoder
    the prompt; the denoising loop ref prompt_embeds (+ the seeded noise); each transformer step
    alone (tf_velocity_step<k>) ref latents_step<k-1> (noise for k = 1); the VAE ref latents_final."""
    with torch.no_grad():
        out = {"prompt_embeds": pipe.encode_prompt(prompt=RUN["prompt"], device=torch.device("cpu"))[0].numpy()}
        out["image"] = pipe.vae.decode(torch.from_numpy(ref["latents_final"]), return_dict=False)[0].numpy()
    free = run_pipeline(pipe, prompt_embeds=ref["prompt_embeds"])
    out.update({k: free[k] for k in STEPS})
    for k in range(RUN["steps"]):
        lat = ref["noise"] if k == 0 else ref[f"latents_step{k}"]
        out[f"tf_velocity_step{k + 1}"] = dit_step(pipe, lat, ref["prompt_embeds"], float(ref["timesteps"][k]))
    return out


def rel(a, b):
    """||a - b|| / ||b|| (float64): the norm-relative error the C++ test bounds."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def envelope(pipe, ref, runs):
    """rel(perturbed, ref) per teacher-forced boundary for `runs` seeded last-bit perturbations of
    every rounding linear's input (PERTURB): how far the reference itself moves when its float32
    arithmetic changes in the last bit, i.e. the rounding flips any other float32 implementation
    (klein) must be allowed."""
    out = {}
    try:
        for r in range(runs):
            PERTURB["seed"] = 1 + r
            for k, v in teacher_forced(pipe, ref).items():
                out.setdefault(k, []).append(rel(v, ref[k.removeprefix("tf_")]))
    finally:
        PERTURB["seed"] = None
    return {k: sorted(v) for k, v in out.items()}


def klein_run(klein, qmodel, isa, tmp):
    d = tempfile.mkdtemp(dir=tmp)
    subprocess.run([klein, "generate", "-q", "--model", qmodel, "--prompt", RUN["prompt"], "-W", str(RUN["width"]),
                    "-H", str(RUN["height"]), "--steps", str(RUN["steps"]), "--seed", str(RUN["seed"]),
                    "--precision", "fast", "--isa", isa, "--threads", "2", "--dump", d, "-o",
                    os.path.join(d, "out.png")], check=True)
    return d


def load_patched(model, qmodel, case):
    pipe = Flux2KleinPipeline.from_pretrained(model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    hashes, counts = {}, {}
    for comp in ("text_encoder", "transformer", "vae"):
        orig = read_safetensors(os.path.join(model, comp)) if comp in QUANTIZED_COMPONENTS else {}
        qdir = os.path.join(qmodel, comp) if comp in QUANTIZED_COMPONENTS else None
        hashes[comp], counts[comp] = patch_component(getattr(pipe, comp), comp, qdir, case, orig)
    n_conv = patch_convs(pipe.vae, case)
    if n_conv:
        counts["vae"]["conv_bf16"] = n_conv
    want = "w8a8" if case["type"] == "q8" else ("w4a8" if case["q4"] == "w4a8" else "f32")
    for comp in QUANTIZED_COMPONENTS:  # the fixtures must exercise real quantized layers in both
        assert counts[comp].get(want), (case["name"], comp, counts[comp])
    return pipe, {c: h for c, h in hashes.items() if h}, counts


def run_case(case, args, tmp):
    SDPA["bf16"] = case["float"] == "bf16"  # until the unquantized model runs (below)
    model = assemble(case["variant"], tmp)
    qmodel = quantize(args.klein, model, case["type"], tmp)
    pipe, hashes, counts = load_patched(model, qmodel, case)
    ref = run_pipeline(pipe)
    # The teacher-forced inputs reproduce the pipeline's own values exactly.
    again = teacher_forced(pipe, ref)
    for k in ["prompt_embeds", "image"] + STEPS:
        assert np.array_equal(again[k], ref[k]), (case["name"], k)
    for k in range(RUN["steps"]):
        assert np.array_equal(again[f"tf_velocity_step{k + 1}"], ref[f"velocity_step{k + 1}"]), (case["name"], k)
    env = envelope(pipe, ref, args.envelope_runs)
    SDPA["bf16"] = False  # the unquantized model: torch's attention
    plain = Flux2KleinPipeline.from_pretrained(model, dtype=torch.float32)
    plain.set_progress_bar_config(disable=True)
    unq = {k: rel(v, ref[k.removeprefix("tf_")]) for k, v in teacher_forced(plain, ref).items()}

    cdir = os.path.join(args.out, case["name"])
    if os.path.exists(cdir):
        shutil.rmtree(cdir)
    os.makedirs(cdir)
    files = {}
    for k, v in ref.items():
        assert np.all(np.isfinite(v)), (case["name"], k)
        np.save(os.path.join(cdir, k + ".npy"), np.ascontiguousarray(v, dtype=np.float32))
        files[k + ".npy"] = {"shape": list(v.shape), "dtype": "float32"}
    model_desc = "tests/data/tiny" + ("" if not case["variant"] else
                                      " with text_encoder/ and transformer/ of tests/data/tiny_" + case["variant"])
    entry = dict(name=case["name"], dir=case["name"], type=case["type"], model=model_desc, variant=case["variant"],
                 q4_linear=case["q4"], float_linear=case["float"], **RUN, te_layers=list(TE_LAYERS),
                 timesteps=[float(t) for t in ref["timesteps"]], linear_counts=counts,
                 quantized_tensor_fnv1a64=hashes,
                 envelope=dict(runs=args.envelope_runs, eps=PERTURB["eps"], rel=env),
                 rel_to_unquantized=unq, files=files)
    print(f"{case['name']:14s} linears {counts}")
    for k in env:
        print(f"  {k:18s} envelope max {env[k][-1]:.1e} (median {env[k][len(env[k]) // 2]:.1e})"
              f"  unquantized {unq[k]:.1e}")
    if args.compare_klein is not None:  # klein end to end (its own embeddings and latents)
        for isa in args.compare_klein or ["scalar", "avx512_bf16"]:
            d = klein_run(args.klein, qmodel, isa, tmp)
            errs = {k: rel(np.load(os.path.join(d, k + ".npy")), ref[k]) for k in ["prompt_embeds"] + STEPS +
                    ["latents_final", "image"]}
            print(f"  klein --isa {isa:12s} " + " ".join(f"{k}={e:.1e}" for k, e in errs.items()))
    return entry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--klein", default=os.path.join(REPO_ROOT, "build", "klein"))
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", default=None, help="case names to (re)run")
    ap.add_argument("--envelope-runs", type=int, default=8, help="perturbed runs per case for the envelope")
    ap.add_argument("--compare-klein", nargs="*", default=None, metavar="ISA",
                    help="also run klein generate --precision fast --isa ISA (default: scalar and avx512_bf16) "
                         "end to end and print ||klein - ref|| / ||ref|| per boundary")
    args = ap.parse_args()
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.json")
    old = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as fh:
            old = {c["name"]: c for c in json.load(fh)["cases"]}
    entries = []
    with tempfile.TemporaryDirectory(prefix="klein_quant_ref_") as tmp:
        for case in CASES:
            if args.only and case["name"] not in args.only:
                if case["name"] in old:
                    entries.append(old[case["name"]])
                continue
            entries.append(run_case(case, args, tmp))
    manifest = dict(
        description="Quantized references for klein.cpp (tests/test_quant_ref.cpp): `klein quantize` output, "
                    "checked against the recipes, computed by the real diffusers Flux2KleinPipeline in float32 "
                    "with klein's fast-kernel arithmetic on every Linear. See scripts/reference/README.md.",
        versions=dict(torch=torch.__version__, diffusers=diffusers.__version__,
                      transformers=transformers.__version__, numpy=np.__version__),
        cases=entries)
    with open(manifest_path, "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.write("\n")
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(args.out) for f in fs)
    print(f"wrote {manifest_path}; {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
