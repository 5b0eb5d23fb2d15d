"""Text to image: the README's first Python example. KLEIN_MODEL names the model folder or file."""

import os

import klein

pipe = klein.Flux2KleinPipeline.from_pretrained(os.environ.get("KLEIN_MODEL", "FLUX.2-klein-4B"),
                                                threads=int(os.environ.get("KLEIN_THREADS", "0")))
image = pipe("a red fox in the snow", height=256, width=256, num_inference_steps=4, generator=0).images[0]
image.save("fox.png")
