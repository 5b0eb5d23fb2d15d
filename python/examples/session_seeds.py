"""One prompt, several seeds: a Session encodes the prompt once, then denoises and decodes per
seed, with a live preview of every step as a numpy array."""

import os

import numpy as np
import numpy.typing as npt

import klein

pipe = klein.Flux2KleinPipeline.from_pretrained(os.environ.get("KLEIN_MODEL", "FLUX.2-klein-4B"),
                                                threads=int(os.environ.get("KLEIN_THREADS", "0")))


def show(step: int, total: int, preview: npt.NDArray[np.uint8]) -> None:
    print(f"step {step}/{total}: preview {preview.shape}, mean {preview.mean():.1f}")


session = pipe.session()
session.encode_prompt("a lighthouse on a cliff at dusk")
for seed in (1, 2, 3):
    session.denoise(generator=seed, height=256, width=256, callback=show)
    session.decode().save(f"lighthouse-{seed}.png")
