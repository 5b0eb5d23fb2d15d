#!/usr/bin/env python3
"""Validate a folder written by `klein-make_random_model` with the REAL library classes.

For each component it
  1. loads it with from_pretrained (bf16, low_cpu_mem_usage, warnings shown) and fails on any
     missing / unexpected / mismatched key or loader error message;
  2. independently compares every safetensors header (key, shape, dtype) with the instantiated
     model's state_dict (tied lm_head excepted);
  3. runs a small forward pass and prints the std / max|x| of the activations, failing on
     non-finite values or an exploding scale.

Usage (oracle venv):
    /work/oracle-venv/bin/python scripts/reference/check_random_model.py /tmp/klein-random-4b \
        [--text-tokens 16] [--latent 8] [--threads 2] [--components scheduler,text_encoder,transformer,vae]

--latent L: the transformer runs on an L x L token grid (a 16L x 16L px image); the VAE decodes
the matching latents [1, 32, 2L, 2L] -> [1, 3, 16L, 16L] and encodes a 16L x 16L image.
The text encoder and transformer run in bf16 (as stored), which is slow on CPUs without native
bf16 (minutes for L = 8); the VAE forward runs in float32.
Exit code 0 when everything passed.
"""

import argparse
import glob
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

import diffusers  # noqa: E402
import transformers  # noqa: E402
from diffusers import (  # noqa: E402
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Transformer2DModel,
)
from transformers import AutoTokenizer, Qwen3ForCausalLM  # noqa: E402

FAILURES = []

ST_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "I64": torch.int64}


def fail(msg):
    FAILURES.append(msg)
    print(f"  FAIL: {msg}")


def stats(name, t, limit=1e4):
    t = t.detach().float()
    finite = bool(torch.isfinite(t).all())
    std = t.std().item() if t.numel() > 1 else float("nan")
    amax = t.abs().max().item()
    print(f"  {name:<44s} shape {str(list(t.shape)):<22s} mean {t.mean().item():+.4f}  std {std:.4f}  max|x| {amax:.3f}")
    if not finite:
        fail(f"{name}: non-finite values")
    elif amax > limit or not (std > 1e-6):
        fail(f"{name}: suspicious scale (std {std}, max|x| {amax})")


def header_keys(folder):
    """{key: (shape, dtype)} from every *.safetensors in folder (and the index's weight map)."""
    out = {}
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    for f in files:
        with safe_open(f, "pt") as sf:
            for k in sf.keys():
                sl = sf.get_slice(k)
                if k in out:
                    fail(f"{os.path.basename(f)}: duplicate key {k}")
                out[k] = (list(sl.get_shape()), sl.get_dtype(), os.path.basename(f))
    idx = glob.glob(os.path.join(folder, "*.safetensors.index.json"))
    if idx:
        wm = json.load(open(idx[0]))["weight_map"]
        if set(wm) != set(out):
            fail(f"{idx[0]}: weight_map keys differ from the shards' keys")
        for k, fn in wm.items():
            if k in out and out[k][2] != fn:
                fail(f"{idx[0]}: {k} mapped to {fn}, found in {out[k][2]}")
    print(f"  {len(files)} safetensors file(s), {len(out)} tensors, "
          f"{sum(os.path.getsize(f) for f in files) / 1e9:.2f} GB")
    return out


def compare_state_dict(model, files, ignore=()):
    sd = model.state_dict()
    keys_model = {k for k in sd if k not in ignore}
    missing = sorted(keys_model - set(files))
    unexpected = sorted(set(files) - keys_model)
    if missing:
        fail(f"keys in the model, not in the files ({len(missing)}): {missing[:8]}")
    if unexpected:
        fail(f"keys in the files, not in the model ({len(unexpected)}): {unexpected[:8]}")
    bad = []
    for k in sorted(keys_model & set(files)):
        shape, dt, _ = files[k]
        if list(sd[k].shape) != shape:
            bad.append(f"{k}: file {shape} model {list(sd[k].shape)}")
        if k.endswith("num_batches_tracked"):
            if dt != "I64":
                bad.append(f"{k}: dtype {dt}, want I64")
    if bad:
        fail(f"shape/dtype mismatches ({len(bad)}): {bad[:8]}")
    if not (missing or unexpected or bad):
        print(f"  state_dict vs files: all {len(keys_model)} keys present with matching shapes")


def check_loading_info(info):
    n = 0
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        v = info.get(k) if isinstance(info, dict) else None
        if v:
            fail(f"loader reported {k}: {list(v)[:8]}")
            n += 1
    if n == 0:
        print("  loader: no missing / unexpected / mismatched keys, no errors")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="folder written by klein-make_random_model")
    ap.add_argument("--text-tokens", type=int, default=16)
    ap.add_argument("--latent", type=int, default=8, help="transformer token grid L x L")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--components", default="scheduler,text_encoder,transformer,vae",
                    help="comma-separated subset to check")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_warning()
    diffusers.utils.logging.set_verbosity_warning()
    root = args.model
    comps = set(args.components.split(","))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, diffusers {diffusers.__version__}")
    print(f"model: {root}")

    mi = json.load(open(os.path.join(root, "model_index.json")))
    print(f"model_index.json: {mi['_class_name']}, is_distilled {mi.get('is_distilled')}")
    for comp, want in {
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2TokenizerFast"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    }.items():
        if mi.get(comp) != want:
            fail(f"model_index.json: {comp} = {mi.get(comp)}, want {want}")
    if mi["_class_name"] != "Flux2KleinPipeline" or mi.get("is_distilled") is not True:
        fail("model_index.json: not a distilled Flux2KleinPipeline")

    # ---------------- scheduler ----------------
    print("\n[scheduler]")
    check_scheduler(root)
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "tokenizer"))
    print(f"\n[tokenizer]\n  {type(tok).__name__}, vocab {len(tok)}")
    pe = None
    if "text_encoder" in comps:
        pe = check_text_encoder(root, tok, args)
    if pe is None:
        pe = torch.randn(1, args.text_tokens, 7680, dtype=torch.bfloat16)
    if "transformer" in comps:
        check_transformer(root, pe, args)
    if "vae" in comps:
        check_vae(root, args)

    print()
    if FAILURES:
        print(f"FAILED ({len(FAILURES)}):")
        for f in FAILURES:
            print(f"  - {f}")
        return 1
    print("ALL CHECKS PASSED")
    return 0


def check_scheduler(root):
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(root, subfolder="scheduler")
    c = sched.config
    print(f"  use_dynamic_shifting {c.use_dynamic_shifting}, shift {c.shift}, time_shift_type {c.time_shift_type}")
    if not (c.use_dynamic_shifting and c.shift == 3.0 and c.time_shift_type == "exponential"):
        fail("scheduler config is not the FLUX.2 one")
    n = 4
    sigmas = [1.0 - i / n for i in range(n)]
    sched.set_timesteps(sigmas=sigmas, mu=1.0)
    print(f"  set_timesteps(4 steps, mu 1.0): timesteps {[round(t, 3) for t in sched.timesteps.tolist()]}")


def check_text_encoder(root, tok, args):
    print("\n[text_encoder]")
    te_dir = os.path.join(root, "text_encoder")
    files = header_keys(te_dir)
    t0 = time.time()
    te, info = Qwen3ForCausalLM.from_pretrained(
        te_dir, torch_dtype=torch.bfloat16, low_cpu_mem_usage=True, output_loading_info=True)
    te.eval()
    print(f"  loaded in {time.time() - t0:.1f} s: {type(te).__name__}, {te.config.num_hidden_layers} layers, "
          f"dtype {te.dtype}, {sum(p.numel() for p in te.parameters()) / 1e9:.3f} B params")
    check_loading_info(info)
    compare_state_dict(te, files, ignore=("lm_head.weight",))
    if te.lm_head.weight.data_ptr() != te.model.embed_tokens.weight.data_ptr():
        fail("lm_head is not tied to embed_tokens")
    layers = te.config.num_hidden_layers
    taps = [k for k in (9, 18, 27) if k <= layers]
    with torch.no_grad():
        t0 = time.time()
        if layers >= 27:
            pe = Flux2KleinPipeline._get_qwen3_prompt_embeds(
                te, tok, "a photo of a red fox in the snow", max_sequence_length=args.text_tokens)
        else:
            pe = None
        ids = tok("a photo of a red fox in the snow, high detail", return_tensors="pt").input_ids[:, : args.text_tokens]
        out = te(input_ids=ids, output_hidden_states=True, use_cache=False)
        print(f"  forward on {ids.shape[1]} tokens ({time.time() - t0:.1f} s, incl. the prompt-embeds pass):")
        stats("hidden_states[0] (embeddings)", out.hidden_states[0])
        for k in taps:
            stats(f"hidden_states[{k}]", out.hidden_states[k])
        stats(f"hidden_states[{layers}] (after final norm)", out.hidden_states[layers])
        stats("logits", out.logits, limit=1e5)
        if pe is not None:
            stats(f"prompt_embeds (layers 9/18/27, {args.text_tokens} tok)", pe)
    del te, out
    return pe


def check_transformer(root, pe, args):
    print("\n[transformer]")
    tr_dir = os.path.join(root, "transformer")
    files = header_keys(tr_dir)
    t0 = time.time()
    tr, info = Flux2Transformer2DModel.from_pretrained(
        tr_dir, torch_dtype=torch.bfloat16, low_cpu_mem_usage=True, output_loading_info=True)
    tr.eval()
    print(f"  loaded in {time.time() - t0:.1f} s: dtype {tr.dtype}, "
          f"{sum(p.numel() for p in tr.parameters()) / 1e9:.3f} B params")
    check_loading_info(info)
    compare_state_dict(tr, files)
    L = args.latent
    with torch.no_grad():
        lat = torch.randn(1, 128, L, L, dtype=torch.bfloat16)
        img_ids = Flux2KleinPipeline._prepare_latent_ids(lat)
        txt_ids = Flux2KleinPipeline._prepare_text_ids(pe)
        x = lat.flatten(2).transpose(1, 2)  # [1, L*L, 128]
        acts = {}
        hooks = []
        for name in ("x_embedder", "context_embedder", "time_guidance_embed", "double_stream_modulation_img",
                     "transformer_blocks.4", "single_transformer_blocks.19", "norm_out"):
            mod = tr.get_submodule(name)
            hooks.append(mod.register_forward_hook(
                lambda m, i, o, name=name: acts.__setitem__(name, o[-1] if isinstance(o, tuple) else o)))
        t0 = time.time()
        y = tr(hidden_states=x, encoder_hidden_states=pe, timestep=torch.tensor([0.75]),
               img_ids=img_ids, txt_ids=txt_ids, guidance=None, return_dict=False)[0]
        for h in hooks:
            h.remove()
        print(f"  forward, {L * L} image + {pe.shape[1]} text tokens, t = 0.75 ({time.time() - t0:.1f} s):")
        for name, a in acts.items():
            if isinstance(a, tuple):
                a = a[0][0] if isinstance(a[0], tuple) else a[0]
            stats(name, a)
        stats("output (velocity)", y)
    del tr


def check_vae(root, args):
    L = args.latent
    print("\n[vae]")
    vae_dir = os.path.join(root, "vae")
    files = header_keys(vae_dir)
    vae, info = AutoencoderKLFlux2.from_pretrained(
        vae_dir, torch_dtype=torch.bfloat16, low_cpu_mem_usage=True, output_loading_info=True)
    vae.eval()
    check_loading_info(info)
    compare_state_dict(vae, files)
    nbt = vae.bn.num_batches_tracked
    print(f"  bn: running_mean std {vae.bn.running_mean.float().std().item():.4f}, running_var "
          f"[{vae.bn.running_var.float().min().item():.3f}, {vae.bn.running_var.float().max().item():.3f}], "
          f"num_batches_tracked {nbt.item()} ({nbt.dtype}, shape {list(nbt.shape)})")
    if not (vae.bn.running_var > 0).all():
        fail("bn.running_var not positive")
    # CPU bf16 convolutions are extremely slow, so the forward runs in float32; the load check
    # above was done in bf16.
    vae = vae.float()
    with torch.no_grad():
        # Pipeline-style decode of the transformer's L x L grid: BN de-normalisation, unpatchify, decode.
        t0 = time.time()
        z = torch.randn(1, 128, L, L)
        mean = vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
        z = z * std + mean
        z = Flux2KleinPipeline._unpatchify_latents(z)  # [1, 32, 2L, 2L]
        img = vae.decode(z, return_dict=False)[0]
        print(f"  decode of latents {list(z.shape)} ({time.time() - t0:.1f} s):")
        stats("decoded image", img)
        t0 = time.time()
        x = torch.rand(1, 3, 16 * L, 16 * L) * 2 - 1
        post = vae.encode(x).latent_dist
        print(f"  encode of image {list(x.shape)} ({time.time() - t0:.1f} s):")
        stats("latent mean", post.mean)
        stats("latent std (posterior)", post.std)


if __name__ == "__main__":
    sys.exit(main())
