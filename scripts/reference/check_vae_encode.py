#!/usr/bin/env python3
"""Make (and optionally check) a VAE encode fixture with the real diffusers AutoencoderKLFlux2.

Loads tests/data/tiny/vae (float32), encodes a seeded random image in [-1, 1] and writes
  OUT/image.npy  (1, 3, H, W) float32
  OUT/mean.npy   (1, latent_channels, H/8, W/8) float32 = latent_dist.mean (= mode())
  OUT/image_latents.npy  patchified + BN-normalised mean, as Flux2KleinPipeline._encode_vae_image
Then the C++ side is checked with
  KLEIN_VAE_ENC_FIXTURE=OUT build/tests/klein_tests --gtest_filter='Flux2VaeRef.EncodeMeanExternal*'
or, with --ours FILE.npy (e.g. a "vae_enc.mean" dump), this script prints max|ours - ref| / max|ref|.

Usage: /work/oracle-venv/bin/python scripts/reference/check_vae_encode.py --out /tmp/vae_enc [--size 64 48]
"""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import AutoencoderKLFlux2  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO_ROOT, "tests", "data", "tiny", "vae"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", nargs=2, type=int, default=[64, 48], metavar=("H", "W"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--ours", default=None, help="a .npy of our encode_mean output to compare")
    args = ap.parse_args()

    vae = AutoencoderKLFlux2.from_pretrained(args.model, torch_dtype=torch.float32).eval()
    H, W = args.size
    g = torch.Generator("cpu").manual_seed(args.seed)
    x = torch.rand((1, vae.config.in_channels, H, W), generator=g, dtype=torch.float32) * 2 - 1
    with torch.no_grad():
        mean = vae.encode(x).latent_dist.mean
        b, c, h, w = mean.shape
        p = mean.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)
        bn_mean = vae.bn.running_mean.view(1, -1, 1, 1)
        bn_std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
        latents = (p - bn_mean) / bn_std
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "image.npy"), x.numpy())
    np.save(os.path.join(args.out, "mean.npy"), mean.numpy())
    np.save(os.path.join(args.out, "image_latents.npy"), latents.numpy())
    print(f"wrote {args.out}: image {tuple(x.shape)}, mean {tuple(mean.shape)}")
    if args.ours:
        ours = np.load(args.ours).reshape(mean.shape)
        ref = mean.numpy()
        err = np.abs(ours - ref).max() / np.abs(ref).max()
        print(f"max|ours - ref| / max|ref| = {err:.3g}")
        return 0 if err <= 1e-5 else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
