"""diffusers' FLUX.2 VAE encoder alone (the reference-image encode of editing), for a side-by-side
with klein's (tests/test_flux2_vae.cpp FullSizeMeasurement, KLEIN_FULL_VAE_MODE=encode).

Runs in the pinned oracle venv (scripts/reference/requirements.txt), never in CI:
    python bench/pytorch_vae_encode.py MODEL_DIR [CALLS] [PX]
bf16 weights and a channels-last input, as Flux2KleinPipeline runs it; 2 threads; one warm-up call (oneDNN
primitive creation), then CALLS timed calls on a random PX² image, one line each:
    pt_encode 1.816
"""
import sys
import time

import torch
from diffusers import AutoencoderKLFlux2


def main() -> None:
    model = sys.argv[1]
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    px = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    torch.set_num_threads(2)
    vae = AutoencoderKLFlux2.from_pretrained(model, subfolder="vae", torch_dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(1, 3, px, px, generator=g) * 2 - 1).to(torch.bfloat16)
    # Channels-last, as the pipeline's reference arrives (PIL's HWC layout through the image
    # processor): oneDNN then runs the convs in NHWC form, ~2x faster here than on NCHW input.
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        vae.encode(x)
        for _ in range(calls):
            t = time.perf_counter()
            vae.encode(x)
            print(f"pt_encode {time.perf_counter() - t:.3f}", flush=True)


if __name__ == "__main__":
    main()
