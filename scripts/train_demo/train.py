#!/usr/bin/env python3
"""Train klein.cpp's demo model: a tiny FLUX.2 [klein] (diffusers' own classes, scaled down) that
draws coloured shapes from captions in the default 4 steps at 128x128.

Stages (all seeded; the same command gives the same files on the same machine/torch build):
  1. text encoder: a Qwen3ForCausalLM (28 layers, hidden 32, the real Qwen3 tokenizer), random and
     frozen. Its layer-9/18/27 states still tell the words apart, which is all the DiT needs here.
  2. VAE (AutoencoderKLFlux2, 4 blocks, 32 latent channels): trained for reconstruction on the
     synthetic pictures, first on 32/64-pixel crops, then on whole pictures (train_vae); then
     bn.running_mean/var set to the statistics of its patchified latents, as the pipeline
     normalises with them.
  3. transformer (Flux2Transformer2DModel, 2 double + 4 single blocks, inner 128): flow matching on
     the VAE's latents with the pipeline's own prompt embeddings, ids and packing; timesteps half
     drawn from the exact 4-step schedule at 128x128 (what the default run evaluates), half from the
     shifted continuous distribution (so other step counts and sizes work too). EMA weights are kept.
  4. export: diffusers layout in bf16 (model_index.json, scheduler, tokenizer copied from the tiny
     test model, which holds the real Qwen3 tokenizer), sample grids through diffusers' own
     Flux2KleinPipeline, losses in log.txt.

Usage (the oracle venv of scripts/reference, plus nothing else):
    python scripts/train_demo/train.py --out /tmp/demo-run            # ~85 min on 2 cores (estimate: README)
    python scripts/train_demo/train.py --out /tmp/smoke --smoke       # 2 min: every stage, few steps
The model folder is OUT/model; copy it to models/demo to ship it.
"""
import argparse
import copy
import json
import math
import os
import random
import shutil
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402

from diffusers import (  # noqa: E402
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Transformer2DModel,
)
from transformers import Qwen2TokenizerFast, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shapes  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(REPO_ROOT, "tests", "data", "tiny")

TEXT_ENCODER_CONFIG = dict(
    vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=28,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_act="silu",
    max_position_embeddings=40960, rms_norm_eps=1e-6,
    rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, tie_word_embeddings=True,
    attention_bias=False, attention_dropout=0.0, use_sliding_window=False, sliding_window=None,
    max_window_layers=28, bos_token_id=151643, eos_token_id=151645, initializer_range=0.02,
    use_cache=True,
)
TRANSFORMER_CONFIG = dict(
    patch_size=1, in_channels=128, out_channels=None, num_layers=2, num_single_layers=4,
    attention_head_dim=32, num_attention_heads=4, joint_attention_dim=96,
    timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(8, 8, 8, 8), rope_theta=2000,
    eps=1e-6, guidance_embeds=False,
)
VAE_CONFIG = dict(
    in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(16, 32, 64, 64),
    decoder_block_out_channels=None, layers_per_block=1, act_fn="silu", latent_channels=32,
    norm_num_groups=8, sample_size=shapes.RES, use_quant_conv=True, use_post_quant_conv=True,
    mid_block_add_attention=True, batch_norm_eps=1e-4, batch_norm_momentum=0.1, patch_size=(2, 2),
)
SCHEDULER_CONFIG_FILE = os.path.join(TINY, "scheduler", "scheduler_config.json")

GRID_PROMPTS = [p for p, *_ in shapes.TEST_PROMPTS[:16]]


class Log:
    def __init__(self, path):
        self.f = open(path, "a")
        self.t0 = time.time()

    def __call__(self, msg):
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def to_tensor(images):
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return x


def batch(rng, n):
    ims, caps = zip(*(shapes.training_example(rng) for _ in range(n)))
    return to_tensor(ims), list(caps)


def make_text_encoder(seed):
    gen = torch.Generator().manual_seed(seed)
    te = Qwen3ForCausalLM(Qwen3Config(**TEXT_ENCODER_CONFIG)).eval()
    with torch.no_grad():
        for name, p in te.named_parameters():
            if name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
    # What ships is bf16: train against exactly those weights.
    te.to(torch.bfloat16).to(torch.float32)
    for p in te.parameters():
        p.requires_grad_(False)
    return te


def encode(te, tok, captions):
    """Flux2KleinPipeline._get_qwen3_prompt_embeds without the LM head's logits (which it computes
    and throws away: 40 GFLOP a batch here). Checked equal to the pipeline's own once per run."""
    ids, masks = [], []
    for c in captions:
        text = tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
        t = tok(text, return_tensors="pt", padding="max_length", truncation=True, max_length=512)
        ids.append(t["input_ids"])
        masks.append(t["attention_mask"])
    with torch.no_grad():
        out = te.model(input_ids=torch.cat(ids), attention_mask=torch.cat(masks), output_hidden_states=True,
                       use_cache=False)
        h = torch.stack([out.hidden_states[k] for k in (9, 18, 27)], dim=1)
        b, n, l, d = h.shape
        return h.permute(0, 2, 1, 3).reshape(b, l, n * d).float()


def check_encode(te, tok):
    caps = ["a red circle", "three big blue stars on a white background"]
    with torch.no_grad():
        ref = Flux2KleinPipeline._get_qwen3_prompt_embeds(te, tok, caps, dtype=torch.float32)
    got = encode(te, tok, caps)
    assert torch.equal(ref, got), (ref - got).abs().max()


class EmbeddingPool:
    """A fixed set of training scenes with their captions' embeddings computed once (the frozen
    encoder's 512-token forward is the costliest part of a step otherwise). Every use of a scene
    draws it anew (positions, sizes and shades jitter), so pictures never repeat."""

    def __init__(self, te, tok, rng, n, log):
        self.items = [shapes.training_scene(rng) for _ in range(n)]
        embs = []
        for i in range(0, n, 32):
            embs.append(encode(te, tok, [c for _, c in self.items[i:i + 32]]))
            if i % 1024 == 0:
                log(f"text embeddings {i}/{n}")
        self.emb = torch.cat(embs)
        log(f"pool: {n} scenes, {len(set(c for _, c in self.items))} distinct captions, "
            f"{self.emb.numel() * 4 / 2**30:.2f} GiB of embeddings")

    def batch(self, rng, n):
        idx = [rng.randrange(len(self.items)) for _ in range(n)]
        ims = [shapes.render(self.items[i][0], rng) for i in idx]
        return to_tensor(ims), self.emb[idx]


def train_vae(args, log, rng):
    """Reconstruction with a size curriculum: random 32- and 64-pixel crops first (10x the steps
    per second of whole pictures, and per step they teach as much), then whole 128x128 pictures,
    whose statistics the GroupNorms see at run time. Latents are the encoder's means plus a little
    noise (so the decoder tolerates the DiT's errors); no KL term: the pipeline normalises latents
    with bn statistics, and their scale is free."""
    torch.manual_seed(args.seed + 1)
    vae = AutoencoderKLFlux2(**VAE_CONFIG)
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, weight_decay=0.0)
    held_out, _ = batch(random.Random(args.seed + 99), 16)
    steps = args.vae_crop_steps + args.vae_steps
    vae.train()
    for step in range(steps):
        whole = step >= args.vae_crop_steps
        if whole:
            size, n = shapes.RES, args.vae_batch
            if step >= args.vae_crop_steps + int(0.6 * args.vae_steps):
                for g in opt.param_groups:
                    g["lr"] = 0.3 * args.vae_lr
        else:
            size = rng.choice([32, 64])
            n = {32: 16, 64: 8}[size]
        x, _ = batch(rng, n)
        i, j = rng.randrange(0, shapes.RES + 1 - size, 8), rng.randrange(0, shapes.RES + 1 - size, 8)
        x = x[:, :, i:i + size, j:j + size]
        mean = vae.encode(x).latent_dist.mean
        rec = vae.decode(mean + 0.05 * torch.randn_like(mean)).sample
        loss = (rec - x).abs().mean() + F.mse_loss(rec, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        if step % 500 == 0 or step == steps - 1:
            with torch.no_grad():
                r = vae.decode(vae.encode(held_out).latent_dist.mean).sample.clamp(-1, 1)
            psnr = -10 * math.log10(F.mse_loss(r, held_out).item() / 4.0)
            log(f"vae step {step}/{steps} ({'whole' if whole else f'{size}px crops'}) loss {loss.item():.4f} "
                f"held-out PSNR {psnr:.2f} dB")
    vae.eval()
    # Round to bf16 (what ships), then measure the latent statistics the pipeline normalises with.
    vae.to(torch.bfloat16).to(torch.float32)
    with torch.no_grad():
        lat = []
        for _ in range(args.bn_batches):
            x, _ = batch(rng, 32)
            mu = vae.encode(x).latent_dist.mode()
            lat.append(Flux2KleinPipeline._patchify_latents(mu))
        lat = torch.cat(lat)
        mean = lat.mean(dim=(0, 2, 3))
        var = lat.var(dim=(0, 2, 3))
        vae.bn.running_mean.copy_(mean)
        vae.bn.running_var.copy_(var)
        vae.bn.num_batches_tracked.fill_(1)
        x, _ = batch(rng, 32)
        rec = vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
        psnr = -10 * math.log10(F.mse_loss(rec, x).item() / 4.0)
    log(f"vae done: held-out reconstruction PSNR {psnr:.2f} dB; latent std range {var.sqrt().min():.3f}..{var.sqrt().max():.3f}")
    return vae


def latents_of(vae, x):
    with torch.no_grad():
        lat = Flux2KleinPipeline._patchify_latents(vae.encode(x).latent_dist.mode())
        mean = vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
        lat = (lat - mean) / std
        ids = Flux2KleinPipeline._prepare_latent_ids(lat)
        return Flux2KleinPipeline._pack_latents(lat), ids


def schedule_sigmas(steps, res):
    """The pipeline's sigmas (without the final 0) for `steps` steps at res x res."""
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu
    seq = (res // 16) ** 2
    mu = compute_empirical_mu(seq, steps)
    s = np.linspace(1.0, 1 / steps, steps)
    return [math.exp(mu) / (math.exp(mu) + (1 / v - 1)) for v in s], mu


def make_pipeline(vae, te, tok, transformer):
    with open(SCHEDULER_CONFIG_FILE) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    return Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**cfg), vae=vae, text_encoder=te,
                              tokenizer=tok, transformer=transformer, is_distilled=True)


def sample_grid(pipe, path, prompts, seeds=(0, 1), embed=None):
    tiles = []
    with torch.no_grad():
        for s in seeds:
            for p in prompts:
                kw = dict(prompt=p) if embed is None else dict(prompt_embeds=embed([p]))
                im = pipe(**kw, height=shapes.RES, width=shapes.RES, num_inference_steps=4,
                          generator=torch.Generator().manual_seed(s), output_type="np").images[0]
                tiles.append((im * 255).round().clip(0, 255).astype(np.uint8))
    cols = len(prompts)
    g = Image.new("RGB", (shapes.RES * cols, shapes.RES * len(seeds)))
    for i, t in enumerate(tiles):
        g.paste(Image.fromarray(t), ((i % cols) * shapes.RES, (i // cols) * shapes.RES))
    g.save(path)


def train_dit(args, log, rng, vae, te, tok, outdir):
    torch.manual_seed(args.seed + 2)
    dit = Flux2Transformer2DModel(**TRANSFORMER_CONFIG)
    with torch.no_grad():
        # adaLN-zero: every block starts as the identity, the output as zero (DiT, Peebles & Xie).
        for name, p in dit.named_parameters():
            if "modulation" in name or name.startswith("norm_out.") or name.startswith("proj_out."):
                p.zero_()
        # Scale the text projection to the (frozen) encoder's output size.
        probe = encode(te, tok, ["a red circle", "three blue stars on a white background"])
        dit.context_embedder.weight.mul_(1.0 / probe.std().item())
    ema = copy.deepcopy(dit).eval()
    for p in ema.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(dit.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    steps = args.dit_steps
    warm = max(1, steps // 50)
    lr_at = lambda s: args.lr * min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s) / args.lr)
    sig4, mu = schedule_sigmas(4, shapes.RES)
    log(f"dit: {sum(p.numel() for p in dit.parameters())} parameters; 4-step sigmas at {shapes.RES}^2: "
        + ", ".join(f"{s:.3f}" for s in sig4) + f" (mu {mu:.3f})")
    e_mu = math.exp(mu)
    txt_ids = None
    gen = torch.Generator().manual_seed(args.seed + 3)
    t_start = time.time()
    running = None
    pool = EmbeddingPool(te, tok, rng, args.pool, log)
    for step in range(steps):
        x, emb = pool.batch(rng, args.batch)
        lat, img_ids = latents_of(vae, x)
        if txt_ids is None:
            txt_ids = Flux2KleinPipeline._prepare_text_ids(emb)[0]
        B = lat.shape[0]
        u = torch.rand(B, generator=gen).clamp(1e-4, 1 - 1e-4)
        cont = e_mu / (e_mu + (1 / u - 1))
        disc = torch.tensor(sig4, dtype=torch.float32)[torch.randint(0, 4, (B,), generator=gen)]
        sigma = torch.where(torch.rand(B, generator=gen) < 0.5, disc, cont)
        noise = torch.randn(lat.shape, generator=gen)
        s = sigma.view(B, 1, 1)
        xt = (1 - s) * lat + s * noise
        v = dit(hidden_states=xt, timestep=sigma, guidance=None, encoder_hidden_states=emb,
                txt_ids=txt_ids, img_ids=img_ids[0], return_dict=False)[0]
        loss = F.mse_loss(v, noise - lat)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dit.parameters(), 1.0)
        opt.step()
        sched.step()
        d = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), dit.parameters()):
                pe.mul_(d).add_(pm, alpha=1 - d)
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 50 == 0 or step == steps - 1:
            el = time.time() - t_start
            log(f"dit step {step}/{steps} loss {loss.item():.4f} (avg {running:.4f}) lr {sched.get_last_lr()[0]:.2e} "
                f"{el / (step + 1):.2f} s/step")
        if args.grid_every and step > 0 and step % args.grid_every == 0:
            sample_grid(make_pipeline(vae, te, tok, ema), os.path.join(outdir, f"grid_{step:05d}.png"), GRID_PROMPTS[:8],
                        seeds=(0,), embed=lambda c: encode(te, tok, c))
            log(f"grid at step {step}")
    return ema


def export(args, log, vae, te, dit, outdir):
    model = os.path.join(outdir, "model")
    if os.path.exists(model):
        shutil.rmtree(model)
    os.makedirs(model)
    te.to(torch.bfloat16).save_pretrained(os.path.join(model, "text_encoder"), safe_serialization=True)
    dit.to(torch.bfloat16).save_pretrained(os.path.join(model, "transformer"), safe_serialization=True)
    vae.to(torch.bfloat16).save_pretrained(os.path.join(model, "vae"), safe_serialization=True)
    shutil.copytree(os.path.join(TINY, "tokenizer"), os.path.join(model, "tokenizer"))
    shutil.copytree(os.path.join(TINY, "scheduler"), os.path.join(model, "scheduler"))
    shutil.copy(os.path.join(TINY, "model_index.json"), os.path.join(model, "model_index.json"))
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(model) for f in fs)
    log(f"exported {model}: {total / 1e6:.1f} MB")
    # The grid through diffusers' pipeline loading the exported (bf16) files, in float32.
    pipe = Flux2KleinPipeline.from_pretrained(model, torch_dtype=torch.float32)
    sample_grid(pipe, os.path.join(outdir, "grid_final.png"), GRID_PROMPTS)
    log("final grid written")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="every stage with a handful of steps")
    ap.add_argument("--vae-crop-steps", type=int, default=8000, help="VAE steps on 32/64-pixel crops")
    ap.add_argument("--vae-steps", type=int, default=2000, help="VAE steps on whole pictures, after the crops")
    ap.add_argument("--vae-batch", type=int, default=8)
    ap.add_argument("--vae-lr", type=float, default=2e-3)
    ap.add_argument("--bn-batches", type=int, default=16)
    ap.add_argument("--dit-steps", type=int, default=2200)
    ap.add_argument("--pool", type=int, default=6000, help="training scenes with precomputed embeddings")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--ema", type=float, default=0.998)
    ap.add_argument("--grid-every", type=int, default=500)
    ap.add_argument("--vae-from", help="reuse OUT/vae.pt of an earlier run (skips stage 2)")
    args = ap.parse_args()
    if args.smoke:
        (args.vae_crop_steps, args.vae_steps, args.dit_steps, args.bn_batches, args.grid_every,
         args.pool) = 10, 10, 10, 2, 5, 64
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "log.txt"))
    log(f"args: {vars(args)}; torch {torch.__version__}")
    rng = random.Random(args.seed)
    tok = Qwen2TokenizerFast.from_pretrained(os.path.join(TINY, "tokenizer"))
    te = make_text_encoder(args.seed)
    check_encode(te, tok)
    if args.vae_from:
        vae = AutoencoderKLFlux2(**VAE_CONFIG)
        vae.load_state_dict(torch.load(args.vae_from))
        vae.eval()
        rng = random.Random(args.seed + 100)
    else:
        vae = train_vae(args, log, rng)
        torch.save(vae.state_dict(), os.path.join(args.out, "vae.pt"))
    for p in vae.parameters():
        p.requires_grad_(False)
    dit = train_dit(args, log, rng, vae, te, tok, args.out)
    export(args, log, vae, te, dit, args.out)
    log("done")


if __name__ == "__main__":
    main()
