#!/usr/bin/env python3
"""The least time a CPU can take for klein's text encode and transformer steps at a given peak.

Counts the multiply-adds klein.cpp itself performs (2 flop each) for one request and divides by a
peak rate — e.g. klein-bench_kernels' "peak bf16 vdpbf16ps" on all threads — so that a speed bar
can be checked against what the hardware allows before any kernel work:

    python3 bench/floor.py --peak 469 --case 256x256:t2i 256x256:edit 512x512:t2i 512x512:edit \\
        [--model DIR] [--prompt-tokens 21]

Plain Python, no packages. What is counted (the architecture's dims from DIR's configs, else
FLUX.2 [klein] 4B's):
  - text encode: the Qwen3 layers up to the last hidden state the pipeline reads (27 of 36), every
    linear layer on all 512 positions (the prompt's padding included, as diffusers computes it),
    plus attention scores and values over the prompt's real keys only (klein skips the padding's
    keys, whose weights are exactly 0);
  - one transformer step: context_embedder, x_embedder, the 5 double and 20 single blocks' linear
    layers and attention over all S = text + image (+ reference) tokens, with the last block's
    trim (rows other than the output image's: K and V only, no query, MLP or to_out), proj_out.
Left out, so the floor is a lower bound: norms, RoPE, softmax, modulation vectors, the VAE and
reference encode, loading. An edit's reference of --ref-size (default: the output size, as
bench/vs_pytorch.sh runs it) adds its tokens to S.
"""

import argparse
import json
import os
import re


def load_cfg(model):
    dit = dict(attention_head_dim=128, num_attention_heads=24, mlp_ratio=3.0, num_layers=5,
               num_single_layers=20, in_channels=128, joint_attention_dim=7680)
    te = dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8,
              head_dim=128, num_hidden_layers=36)
    if model:
        with open(os.path.join(model, "transformer", "config.json")) as f:
            dit.update({k: v for k, v in json.load(f).items() if k in dit})
        with open(os.path.join(model, "text_encoder", "config.json")) as f:
            te.update({k: v for k, v in json.load(f).items() if k in te})
    return dit, te


def text_encode_flop(te, tokens, valid, last_layer=27):
    """Qwen3 layers 1..last_layer on `tokens` positions, `valid` of them the prompt's."""
    h, f, hd = te["hidden_size"], te["intermediate_size"], te["head_dim"]
    q, kv = te["num_attention_heads"] * hd, te["num_key_value_heads"] * hd
    per_token = h * q + 2 * h * kv + q * h + 3 * h * f  # q, k, v, o, gate, up, down
    # Causal attention over the real keys: position i sees min(i + 1, valid) keys; QKᵀ and PV.
    keys = sum(min(i + 1, valid) for i in range(tokens))
    attn = 2 * keys * q
    return 2 * last_layer * (tokens * per_token + attn)


def step_flop(dit, txt, img, ref):
    """One transformer forward: txt text tokens, img output tokens, ref reference tokens."""
    hd, H = dit["attention_head_dim"], dit["num_attention_heads"]
    d = hd * H
    f = int(d * dit["mlp_ratio"])
    s = txt + img + ref
    macs = txt * dit["joint_attention_dim"] * d + (img + ref) * dit["in_channels"] * d  # embedders
    double_row = 4 * d * d + 3 * d * f  # q, k, v, to_out, SwiGLU in (2f), out
    macs += dit["num_layers"] * (s * double_row + 2 * s * s * d)
    single_row = d * (3 * d + 2 * f) + (d + f) * d  # fused qkv + MLP in, fused to_out
    macs += (dit["num_single_layers"] - 1) * (s * single_row + 2 * s * s * d)
    # The last single block: all rows' K and V; the output rows' whole block, attending to all S.
    macs += s * 2 * d * d + img * (single_row - 2 * d * d) + 2 * img * s * d
    macs += img * d * dit["in_channels"]  # proj_out
    return 2 * macs


def kv_cached_step_flop(dit, txt, img, ref):
    """A KV-cached step (9B-KV's steps after the first): text and image rows only, their attention
    over [text, cached reference, image] keys; no reference row is computed."""
    hd, H = dit["attention_head_dim"], dit["num_attention_heads"]
    d = hd * H
    extra = 2 * (txt + img) * ref * d * (dit["num_layers"] + dit["num_single_layers"] - 1) + 2 * img * ref * d
    return step_flop(dit, txt, img, 0) + 2 * extra


def parse_case(ap, case, ref_size):
    """'WxH:t2i' or 'WxH:edit' -> (case, image tokens, reference tokens); bad text ends the run."""
    def tokens(size, what):
        m = re.fullmatch(r"(\d+)x(\d+)", size)
        if not m or int(m[1]) < 16 or int(m[2]) < 16:
            ap.error(f"{what} {size!r}: expected WxH, each at least 16")
        return (int(m[1]) // 16) * (int(m[2]) // 16)

    size, _, mode = case.partition(":")
    if mode not in ("t2i", "edit", "kv"):
        ap.error(f"--case {case!r}: expected WxH:t2i, WxH:edit or WxH:kv")
    img = tokens(size, "--case")
    ref = tokens(ref_size or size, "--ref-size") if mode != "t2i" else 0
    return case, img, ref


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peak", type=float, required=True, help="GFLOP/s, all threads (e.g. the bf16 dot peak)")
    ap.add_argument("--case", nargs="+", default=["256x256:t2i"],
                    help="WxH:t2i, WxH:edit, or WxH:kv (an edit through the KV pipeline: the table below)")
    ap.add_argument("--refs", type=int, default=1, help="references of an edit or kv case (each of --ref-size)")
    ap.add_argument("--ref-size", help="an edit's reference as WxH (default: the output size)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=21, help="the prompt's real tokens, chat template included (21: bench/vs_pytorch.sh's prompt)")
    ap.add_argument("--model", help="a diffusers folder whose configs give the dims")
    a = ap.parse_args()
    if not a.peak > 0 or a.steps < 1 or not 1 <= a.prompt_tokens <= 512 or a.refs < 1:
        ap.error("--peak must be > 0, --steps >= 1, --refs >= 1 and --prompt-tokens 1..512")
    try:
        dit, te = load_cfg(a.model)
    except (OSError, ValueError) as e:
        ap.error(f"--model {a.model}: {e}")
    t_flop = text_encode_flop(te, 512, a.prompt_tokens)
    peak = a.peak * 1e9
    cases = [(c, img, ref * a.refs) for c, img, ref in (parse_case(ap, c, a.ref_size) for c in a.case)]
    print(f"| case | text encode TFLOP | step TFLOP | text encode at peak s | step at peak s | "
          f"text encode + {a.steps} steps at peak s |")
    print("|---|---|---|---|---|---|")
    for c, img, ref in cases:
        s_flop = step_flop(dit, 512, img, ref)
        print(f"| {c} | {t_flop / 1e12:.3f} | {s_flop / 1e12:.3f} | {t_flop / peak:.2f} | {s_flop / peak:.2f} | "
              f"{(t_flop + a.steps * s_flop) / peak:.2f} |")
    kv = [(c, img, ref) for c, img, ref in cases if c.endswith(":kv")]
    if kv:
        # At equal efficiency of every multiply-add: what the KV pipeline's later steps cost beside a
        # step without references, and the whole edit's speed-up over the plain pipeline.
        print(f"\n| kv case ({a.refs} ref) | t2i step TFLOP | cached step TFLOP | cached / t2i | "
              f"{a.steps}-step edit, plain / KV |")
        print("|---|---|---|---|---|")
        for c, img, ref in kv:
            t2i, cached, full = step_flop(dit, 512, img, 0), kv_cached_step_flop(dit, 512, img, ref), step_flop(dit, 512, img, ref)
            print(f"| {c} | {t2i / 1e12:.3f} | {cached / 1e12:.3f} | {cached / t2i:.2f} | "
                  f"{a.steps * full / (full + (a.steps - 1) * cached):.2f} |")

if __name__ == "__main__":
    main()
