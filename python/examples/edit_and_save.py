"""Editing with a reference image, saved with the parameters as PNG text (what the CLI writes),
and compared with the reference."""

import os

import numpy as np

import klein

pipe = klein.Flux2KleinPipeline.from_pretrained(os.environ.get("KLEIN_MODEL", "FLUX.2-klein-4B"),
                                                threads=int(os.environ.get("KLEIN_THREADS", "0")))
reference = np.zeros((128, 192, 3), np.uint8)
reference[:, :96] = (200, 40, 40)  # a red half, as a stand-in for a photo (a path or PIL image works too)
out = pipe("make it blue", image=reference, generator=7, output_type="np")
pixels = np.round(out.images[0] * 255).astype(np.uint8)
klein.save_png("edited.png", pixels, out.metadata[0])
print(out.metadata[0])
print(klein.compare(pixels, reference))
