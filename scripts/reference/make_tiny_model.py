#!/usr/bin/env python3
"""Build a tiny, random-weight FLUX.2 [klein] pipeline with the REAL library classes.

The result (tests/data/tiny/) has exactly the folder layout, file names, config files and
tensor key names of black-forest-labs/FLUX.2-klein-4B, only with tiny dimensions:

    tests/data/tiny/
        model_index.json                       (Flux2KleinPipeline, is_distilled: true)
        scheduler/scheduler_config.json        (FlowMatchEulerDiscreteScheduler, FLUX.2 values)
        text_encoder/config.json               (Qwen3ForCausalLM, tiny Qwen3Config)
        text_encoder/generation_config.json
        text_encoder/model.safetensors         (bf16, tied embeddings -> no lm_head.weight)
        tokenizer/...                          (the real Qwen3 tokenizer, as save_pretrained writes it)
        transformer/config.json                (Flux2Transformer2DModel, tiny)
        transformer/diffusion_pytorch_model.safetensors   (bf16)
        vae/config.json                        (AutoencoderKLFlux2, tiny, 4 blocks)
        vae/diffusion_pytorch_model.safetensors (bf16, incl. bn.running_mean/var)

Everything is seeded; running it twice gives byte-identical safetensors files.

Usage (from the repository root, with the oracle venv, see scripts/reference/README.md):
    python scripts/reference/make_tiny_model.py            # writes tests/data/tiny + copies
    python scripts/reference/make_tiny_model.py --out DIR  # somewhere else
    python scripts/reference/make_tiny_model.py --variant q4   # writes tests/data/tiny_q4 (below)
    python scripts/reference/make_tiny_model.py --variant 9b   # writes tests/data/tiny_9b (below)

Variants (--variant NAME) change some dimensions of the text encoder and the transformer and write
ONLY text_encoder/ and transformer/ (to tests/data/tiny_<NAME>): the full model is tests/data/tiny
with those two folders replaced (same tokenizer, scheduler, VAE and model_index.json), so the
11 MB tokenizer and the VAE are not committed twice.
  q4: every Linear layer of the tiny model has in_features 16, 32 or 96 except the single blocks'
      to_out (128), so `klein quantize --type q4` (groups of 64 along the input) would leave the
      text encoder entirely in bf16. This variant has in_features that are multiples of 64 in both
      models: text encoder hidden 8 (the vocabulary embedding, 151936 x hidden, dominates the
      size), 4 heads x head_dim 16 (o_proj in 64), intermediate 64 (down_proj in 64);
      transformer inner dim 4 x 16 = 64 (MLP 192, single to_out 256), joint_attention_dim 24.
  9b: klein 9B's proportions: transformer 1 double + 3 single blocks (9B: 8 + 24), 4 heads x 8;
      text encoder hidden 8 with 4 query heads per kv head (Qwen3-8B's grouping), MLP 3x hidden;
      joint_attention_dim 24 = 3 x 8, so the 4B-shaped tiny encoder (hidden 16) does not pair with it.
      scripts/reference/dump_9b_reference.py completes the folder (model_index.json and links).
"""

import argparse
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from diffusers import (  # noqa: E402
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Transformer2DModel,
)
from transformers import Qwen2TokenizerFast, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHARED = os.path.abspath(os.path.join(REPO_ROOT, "..", "shared"))
TOKENIZER_SRC = os.path.join(SHARED, "assets", "qwen3-tokenizer")
TOKENIZER_FIXTURES_SRC = os.path.join(SHARED, "fixtures", "tokenizer")

SEED = 0
SIZE_BUDGET_BYTES = 25 * 1000 * 1000  # keep the whole tests/data tree under ~25 MB
REF_SIZE_ESTIMATE = 4_800_000  # what dump_reference.py writes (measured)

# --------------------------------------------------------------------------------------------
# Tiny configurations. Every structural feature of the real 4B model is kept (see README.md).
# --------------------------------------------------------------------------------------------

# Real: Qwen/Qwen3-4B (hidden 2560, 36 layers, 32 q heads, 8 kv heads, head_dim 128, ...).
TEXT_ENCODER_CONFIG = dict(
    vocab_size=151936,  # real value; the tokenizer's ids go up to 151668
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=30,  # taps 9/18/27 exist; layers 27..29 are never needed
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA, 2 query heads per kv head
    head_dim=8,  # explicit; 4*8 = 32 != hidden 16 (like the real 32*128 != 2560)
    hidden_act="silu",
    max_position_embeddings=40960,  # real value (irrelevant for default RoPE)
    rms_norm_eps=1e-6,
    rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
    tie_word_embeddings=True,
    attention_bias=False,
    attention_dropout=0.0,
    use_sliding_window=False,
    sliding_window=None,
    max_window_layers=30,
    bos_token_id=151643,
    eos_token_id=151645,
    initializer_range=0.02,
    use_cache=True,
)

# Real (klein-4B): attention_head_dim 128, heads 24, joint_attention_dim 7680, 5 double, 20 single,
# axes_dims_rope [32,32,32,32], rope_theta 2000, mlp_ratio 3.0, timestep_guidance_channels 256.
TRANSFORMER_CONFIG = dict(
    patch_size=1,
    in_channels=128,  # = 4 * VAE latent_channels (32), as in the real model
    out_channels=None,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,  # inner dim 32, MLP hidden int(32*3.0) = 96
    joint_attention_dim=48,  # = 3 * text hidden 16
    timestep_guidance_channels=256,  # real value: same sinusoid as the real model
    mlp_ratio=3.0,
    axes_dims_rope=(4, 4, 4, 4),  # sum 16 = head dim
    rope_theta=2000,
    eps=1e-6,
    guidance_embeds=False,
)

# Real: block_out_channels [128,256,512,512], layers_per_block 2, norm_num_groups 32, latent 32.
VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(8, 16, 32, 32),  # 4 blocks -> vae_scale_factor 8; channel changes at the same places as (128,256,512,512)
    decoder_block_out_channels=None,
    layers_per_block=2,  # decoder blocks get 3 resnets, like the real model
    act_fn="silu",
    latent_channels=32,
    norm_num_groups=4,  # divides 8,16,32 (2..8 channels per group)
    sample_size=1024,
    use_quant_conv=True,
    use_post_quant_conv=True,
    mid_block_add_attention=True,
    batch_norm_eps=1e-4,
    batch_norm_momentum=0.1,
    patch_size=(2, 2),
)

# FLUX.2 scheduler config (diffusers/FLUX.2-dev scheduler_config.json values).
SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
    invert_sigmas=False,
    shift_terminal=None,
    use_karras_sigmas=False,
    use_exponential_sigmas=False,
    use_beta_sigmas=False,
    time_shift_type="exponential",
    stochastic_sampling=False,
)


# Dimension overrides of the variants (see the module docstring).
VARIANTS = {
    # klein 9B's proportions (transformer 8 double + 24 single blocks, 32 heads; Qwen3-8B: 4 query
    # heads per kv head, MLP 3x hidden) at tiny size, with a text width of its own so that pairing
    # it with the 4B-shaped tiny encoder (hidden 16) is the wrong combination it is in real life.
    "9b": dict(
        text_encoder=dict(hidden_size=8, intermediate_size=24, num_attention_heads=4, num_key_value_heads=1,
                          head_dim=8),
        transformer=dict(num_layers=1, num_single_layers=3, num_attention_heads=4, attention_head_dim=8,
                         axes_dims_rope=(2, 2, 2, 2), joint_attention_dim=24),  # inner 32 = 4 x 8; 24 = 3 x 8
    ),
    "q4": dict(
        text_encoder=dict(hidden_size=8, intermediate_size=64, head_dim=16),
        transformer=dict(num_attention_heads=4, joint_attention_dim=24),  # inner 64 = 4 x 16; 24 = 3 x 8
    ),
}


def _is_norm_weight(name: str) -> bool:
    leaf = name.split(".")[-2] if name.endswith((".weight", ".bias")) else ""
    return "norm" in leaf


@torch.no_grad()
def init_text_encoder(model: Qwen3ForCausalLM, gen: torch.Generator) -> None:
    """Re-initialise so that every layer matters (the default std 0.02 makes layers nearly no-ops).

    - embeddings ~ N(0, 1)
    - every Linear weight ~ N(0, 1/fan_in)  (variance preserving)
    - every RMSNorm weight (input/post_attention layernorm, q_norm, k_norm, final norm) ~ 1 + 0.1 N(0,1)
    """
    for name, p in model.named_parameters():
        if name == "model.embed_tokens.weight":
            p.copy_(torch.randn(p.shape, generator=gen))
        elif "norm" in name:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif p.ndim == 2:
            p.copy_(torch.randn(p.shape, generator=gen) / (p.shape[1] ** 0.5))
        else:
            raise RuntimeError(f"unexpected text-encoder parameter {name} {tuple(p.shape)}")


@torch.no_grad()
def init_transformer(model: Flux2Transformer2DModel, gen: torch.Generator) -> None:
    """Variance-preserving re-init so that every block visibly changes the streams.

    (With PyTorch's default kaiming-uniform init the tiny model's temb/modulation come out ~0.1, so every
    gated block changes its stream by < 5 % and bugs in a block would hide below bf16 noise.)
    - every Linear weight ~ N(0, 1/fan_in); there are no biases in the FLUX.2 transformer
    - the three modulation Linears and norm_out.linear: additionally x3, so shift/scale/gate are O(1)
    - every RMSNorm weight (norm_q, norm_k, norm_added_q, norm_added_k) ~ 1 + 0.1 N(0,1)
    """
    for name, p in model.named_parameters():
        if "norm_q" in name or "norm_k" in name or "norm_added_q" in name or "norm_added_k" in name:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif p.ndim == 2:
            p.copy_(torch.randn(p.shape, generator=gen) / (p.shape[1] ** 0.5))
            if "modulation" in name or name.startswith("norm_out."):
                p.mul_(3.0)
        else:
            raise RuntimeError(f"unexpected transformer parameter {name} {tuple(p.shape)}")


@torch.no_grad()
def init_vae(model: AutoencoderKLFlux2, gen: torch.Generator) -> None:
    """Default init plus perturbation; BatchNorm running stats set to non-trivial values.

    - GroupNorm weights ~ 1 + 0.1 N(0,1), GroupNorm biases ~ 0.1 N(0,1)
    - conv / linear weights and biases: default init + 0.02 N(0,1)
    - bn.running_mean ~ 0.5 N(0,1); bn.running_var ~ U(0.25, 2.25) (positive)
    """
    for name, p in model.named_parameters():
        if _is_norm_weight(name) and name.endswith(".weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif _is_norm_weight(name) and name.endswith(".bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    bn = model.bn
    bn.running_mean.copy_(0.5 * torch.randn(bn.running_mean.shape, generator=gen))
    bn.running_var.copy_(0.25 + 2.0 * torch.rand(bn.running_var.shape, generator=gen))
    bn.num_batches_tracked.fill_(1000)


def build_pipeline(variant=None) -> Flux2KleinPipeline:
    torch.manual_seed(SEED)
    gen = torch.Generator("cpu").manual_seed(SEED)
    over = VARIANTS[variant] if variant else {}

    te_config = Qwen3Config(**{**TEXT_ENCODER_CONFIG, **over.get("text_encoder", {})})
    text_encoder = Qwen3ForCausalLM(te_config).eval()
    init_text_encoder(text_encoder, gen)

    transformer = Flux2Transformer2DModel(**{**TRANSFORMER_CONFIG, **over.get("transformer", {})}).eval()
    init_transformer(transformer, gen)

    vae = AutoencoderKLFlux2(**VAE_CONFIG).eval()
    init_vae(vae, gen)

    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    tokenizer = Qwen2TokenizerFast.from_pretrained(TOKENIZER_SRC)

    pipe = Flux2KleinPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        is_distilled=True,
    )
    # Store weights in bfloat16, like the real model. (The bn num_batches_tracked buffer stays int64.)
    pipe.text_encoder.to(torch.bfloat16)
    pipe.transformer.to(torch.bfloat16)
    pipe.vae.to(torch.bfloat16)
    return pipe


def dir_size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def write_key_listing(tiny_dir: str, out_path: str) -> None:
    lines = []
    for comp, fname in [
        ("transformer", "diffusion_pytorch_model.safetensors"),
        ("vae", "diffusion_pytorch_model.safetensors"),
        ("text_encoder", "model.safetensors"),
    ]:
        path = os.path.join(tiny_dir, comp, fname)
        lines.append(f"# {comp}/{fname}")
        with safe_open(path, framework="pt") as f:
            keys = list(f.keys())
            meta = f.metadata()
            lines.append(f"# metadata: {json.dumps(meta, sort_keys=True)}")
            lines.append(f"# {len(keys)} tensors")
            for k in sorted(keys):
                sl = f.get_slice(k)
                shape = list(sl.get_shape())
                dtype = sl.get_dtype()
                if comp == "text_encoder" and k.startswith("model.layers.") and not k.startswith("model.layers.0."):
                    continue  # layers 1..29 have the same keys as layer 0
                lines.append(f"{k}\t{shape}\t{dtype}")
            if comp == "text_encoder":
                lines.append("# (model.layers.1 .. model.layers.29 have the same keys/shapes/dtypes as model.layers.0)")
        lines.append("")
    with open(out_path, "w") as fh:
        fh.write("\n".join(lines))


DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "data", "tiny")


def write_variant(variant: str, out) -> int:
    """tests/data/tiny_<variant>/{text_encoder,transformer}: overlaid on tests/data/tiny."""
    out = os.path.abspath(out or os.path.join(REPO_ROOT, "tests", "data", "tiny_" + variant))
    if os.path.exists(out):
        shutil.rmtree(out)
    pipe = build_pipeline(variant)
    pipe.text_encoder.save_pretrained(os.path.join(out, "text_encoder"), safe_serialization=True)
    pipe.transformer.save_pretrained(os.path.join(out, "transformer"), safe_serialization=True)
    for comp in ("text_encoder", "transformer"):
        m = getattr(pipe, comp)
        print(f"  {comp}: {type(m).__name__} params={sum(p.numel() for p in m.parameters())}")
    for root, _, files in sorted(os.walk(out)):
        for f in sorted(files):
            fp = os.path.join(root, f)
            print(f"  {os.path.relpath(fp, os.path.dirname(out)):60s} {os.path.getsize(fp):>10d}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--keys-out", default=os.path.join(REPO_ROOT, "scripts", "reference", "tiny_keys.txt"))
    ap.add_argument("--no-vocab-merges", action="store_true", help="do not copy vocab.json/merges.txt")
    ap.add_argument("--variant", choices=sorted(VARIANTS), help="write tests/data/tiny_<variant> (text encoder and "
                    "transformer only) instead of tests/data/tiny")
    args = ap.parse_args()
    if args.variant:
        return write_variant(args.variant, args.out if args.out != DEFAULT_OUT else None)

    out = os.path.abspath(args.out)
    data_root = os.path.dirname(out)
    if os.path.exists(out):
        shutil.rmtree(out)

    pipe = build_pipeline()
    pipe.save_pretrained(out, safe_serialization=True)

    # model_index.json: diffusers records type(tokenizer).__name__, which transformers 5 reports as
    # "Qwen2Tokenizer" (Qwen2TokenizerFast is an alias of it there). The real FLUX.2-klein-4B file says
    # "Qwen2TokenizerFast"; write that so the file matches the real one (both load identically).
    mi_path = os.path.join(out, "model_index.json")
    with open(mi_path) as fh:
        mi = json.load(fh)
    mi["tokenizer"] = ["transformers", "Qwen2TokenizerFast"]
    with open(mi_path, "w") as fh:
        json.dump(mi, fh, indent=2, sort_keys=True)
        fh.write("\n")

    # Tokenizer fixtures (copied verbatim).
    tok_fix_dst = os.path.join(data_root, "tokenizer")
    os.makedirs(tok_fix_dst, exist_ok=True)
    for f in ("public.json", "padded_512.json"):
        shutil.copyfile(os.path.join(TOKENIZER_FIXTURES_SRC, f), os.path.join(tok_fix_dst, f))

    # vocab.json + merges.txt only if save_pretrained did not write them and the budget allows.
    tok_dir = os.path.join(out, "tokenizer")
    vm_dst = os.path.join(data_root, "tokenizer_vocab_merges")
    if os.path.exists(vm_dst):
        shutil.rmtree(vm_dst)
    has_vm = os.path.exists(os.path.join(tok_dir, "vocab.json")) and os.path.exists(os.path.join(tok_dir, "merges.txt"))
    if not has_vm and not args.no_vocab_merges:
        extra = sum(os.path.getsize(os.path.join(TOKENIZER_SRC, f)) for f in ("vocab.json", "merges.txt"))
        # tests/data/ref (written by dump_reference.py) needs ~4.8 MB; count it even if not there yet
        ref_dir = os.path.join(data_root, "ref")
        ref_size = max(dir_size(ref_dir) if os.path.isdir(ref_dir) else 0, REF_SIZE_ESTIMATE)
        projected = dir_size(data_root) - (dir_size(ref_dir) if os.path.isdir(ref_dir) else 0) + ref_size + extra
        if projected <= SIZE_BUDGET_BYTES:
            os.makedirs(vm_dst)
            for f in ("vocab.json", "merges.txt"):
                shutil.copyfile(os.path.join(TOKENIZER_SRC, f), os.path.join(vm_dst, f))
            print(f"copied vocab.json + merges.txt to {vm_dst}")
        else:
            print(f"SKIPPED vocab.json + merges.txt: projected size {projected} > {SIZE_BUDGET_BYTES}")

    write_key_listing(out, args.keys_out)

    # Sanity: reload with the real pipeline class (fp32 upcast) and print a summary.
    p2 = Flux2KleinPipeline.from_pretrained(out, dtype=torch.float32)
    print("reloaded:", type(p2).__name__, "is_distilled", p2.config.is_distilled)
    for comp in ("text_encoder", "transformer", "vae"):
        m = getattr(p2, comp)
        n = sum(p.numel() for p in m.parameters())
        print(f"  {comp}: {type(m).__name__} dtype={m.dtype} params={n}")
    print("  tokenizer:", type(p2.tokenizer).__name__, len(p2.tokenizer))
    print("  text_encoder attn_implementation:", p2.text_encoder.config._attn_implementation)
    for root, _, files in sorted(os.walk(out)):
        for f in sorted(files):
            fp = os.path.join(root, f)
            print(f"  {os.path.relpath(fp, data_root):60s} {os.path.getsize(fp):>10d}")
    print(f"tests/data size now: {dir_size(data_root)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
