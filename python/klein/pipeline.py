"""Flux2KleinPipeline: diffusers' call signature on klein.cpp's engine.

Switching from diffusers is one import::

    from klein import Flux2KleinPipeline          # was: from diffusers import Flux2KleinPipeline
    pipe = Flux2KleinPipeline.from_pretrained("FLUX.2-klein-4B")
    image = pipe("a red fox in the snow", num_inference_steps=4, generator=0).images[0]

The argument checks live here (TypeError / ValueError naming the argument); the engine's own
errors arrive as klein.Error subclasses carrying its one-line message.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from . import _klein

logger = logging.getLogger("klein")

#: A reference image: a file path, encoded bytes (PNG/JPEG/WebP), a uint8 RGB array
#: (height, width, 3) or a PIL image.
ImageInput = Any
#: An int seed (0 .. 2**64-1) or a torch.Generator (its initial_seed()).
GeneratorInput = Any
#: ``callback_on_step_end(pipe, step_index, timestep, callback_kwargs)``.
StepCallback = Callable[[Any, int, Optional[float], Dict[str, Any]], Optional[Dict[str, Any]]]

_PRECISIONS = ("fast", "fp32")
_BACKENDS = ("auto", "cpu", "cuda")
_MEMORY = ("resident", "low")
_VARIANTS = ("auto", "distilled", "base")
_SEED_LIMIT = 2**64

# diffusers arguments that klein does not take, with what to do instead.
_UNSUPPORTED_CALL_ARGS = {
    "sigmas": "klein computes the FlowMatch sigmas itself (num_inference_steps); custom sigmas are not supported",
    "attention_kwargs": "klein has no attention processors to configure",
    "text_encoder_out_layers": "klein's text encoder uses layers (9, 18, 27), as FLUX.2 [klein] was trained",
    "mask_image": "inpainting is not supported by this version of klein",
    "strength": "image-to-image strength is not supported: `image` gives reference images (editing)",
}
_UNSUPPORTED_LOAD_ARGS = {
    "torch_dtype": "klein chooses its arithmetic with precision='fast' (default: bf16/int8 dot products) or "
    "precision='fp32' (diffusers' float32 pipeline, exactly)",
    "device_map": "use backend='cpu' or backend='cuda'",
    "variant": "diffusers' weight-file variant is not used: klein reads the files the folder has "
    "(model_variant='base'/'distilled' says which training a single file holds)",
    "low_cpu_mem_usage": "use memory='low' or max_memory=GiB",
}


@dataclass
class Flux2PipelineOutput:
    """What a pipeline call returns, as diffusers' Flux2PipelineOutput.

    images: PIL images (output_type="pil") or one float32 array (batch, height, width, 3) in
        [0, 1] (output_type="np"; 8-bit values / 255, as the engine's output is 8-bit).
    metadata: per image, the parameters worth recording (prompt, seed, steps, size, ...):
        ``klein.save_png(path, image, metadata)`` writes the PNG the CLI would.
    """

    images: Any
    metadata: List[List[Tuple[str, str]]] = field(default_factory=list)


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _f32(x: Any, name: str, ndim: Optional[int] = None) -> npt.NDArray[np.float32]:
    """numpy / torch arrays as C-contiguous float32 (no copy when already so)."""
    if _is_torch_tensor(x):
        torch = importlib.import_module("torch")  # present: x is a torch tensor (imported by name: no stubs needed)
        x = x.detach().to("cpu", torch.float32).numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array or torch tensor, got {type(x).__name__}")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"{name}: expected floating-point values, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    return np.ascontiguousarray(x, dtype=np.float32)


def _seed_of(g: Any, name: str = "generator") -> int:
    if isinstance(g, bool):
        raise TypeError(f"{name}: expected an int seed or a torch.Generator, got bool")
    if isinstance(g, (int, np.integer)):
        if not 0 <= int(g) < _SEED_LIMIT:
            raise ValueError(f"{name}: seed {int(g)} out of range 0 .. 2**64-1")
        return int(g)
    if type(g).__module__.startswith("torch") and callable(getattr(g, "initial_seed", None)):
        # The seed it was made with (manual_seed): numbers drawn from it since are not seen.
        return int(g.initial_seed()) % _SEED_LIMIT
    raise TypeError(f"{name}: expected an int seed or a torch.Generator (its initial_seed() is used), "
                    f"got {type(g).__name__}")


def _reference(img: Any, index: int) -> Tuple[Optional[str], Optional[Tuple[str, bytes]]]:
    """One reference image as a path or as (name, encoded bytes)."""
    name = f"image{index + 1}"
    if isinstance(img, (str, os.PathLike)):
        return os.fspath(img), None
    if isinstance(img, (bytes, bytearray, memoryview)):
        return None, (name, bytes(img))
    if type(img).__module__.startswith("PIL") and hasattr(img, "convert"):
        img = np.asarray(img.convert("RGB"))
    if isinstance(img, np.ndarray):
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise TypeError(f"image[{index}]: numpy images must be uint8 RGB of shape (height, width, 3), got "
                            f"{img.dtype} {tuple(img.shape)} (a [0, 1] float image: (x * 255).round().astype(np.uint8))")
        # PNG is lossless: the engine decodes exactly these pixels.
        return None, (name, _klein.encode_image(np.ascontiguousarray(img), "png"))
    raise TypeError(f"image[{index}]: expected a file path, encoded image bytes, a uint8 numpy array (H, W, 3) "
                    f"or a PIL image, got {type(img).__name__}")


def _references(image: Any) -> Tuple[List[str], List[Tuple[str, bytes]], List[str]]:
    """paths, in-memory images, and every reference's name for the metadata (paths first)."""
    if image is None:
        return [], [], []
    items = list(image) if isinstance(image, (list, tuple)) else [image]
    paths: List[str] = []
    data: List[Tuple[str, bytes]] = []
    for i, img in enumerate(items):
        p, d = _reference(img, i)
        if p is not None:
            paths.append(p)
        if d is not None:
            data.append(d)
    names = [os.path.basename(os.path.normpath(p)) for p in paths] + [n for n, _ in data]
    return paths, data, names


def _to_pil(arr: npt.NDArray[np.uint8]) -> Any:
    try:
        image = importlib.import_module("PIL.Image")
    except ImportError as e:
        raise ImportError("output_type='pil' needs Pillow (pip install Pillow); output_type='np' works without it") from e
    return image.fromarray(arr, "RGB")


class _Progress:
    """A tqdm bar per image over the denoising steps when tqdm is installed; silent otherwise."""

    def __init__(self, config: Dict[str, Any]) -> None:
        self.config = config
        self.bar: Any = None
        self.tqdm: Any = None
        if not config.get("disable", False):
            try:
                self.tqdm = importlib.import_module("tqdm.auto").tqdm
            except ImportError:
                pass

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.tqdm is None or phase != "denoise":
            return
        if self.bar is None:
            self.bar = self.tqdm(total=total, **self.config)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _step_hook(pipe: Any, cb: StepCallback) -> Callable[[int, int, npt.NDArray[np.uint8]], None]:
    """The engine's preview (step 1..total) as diffusers' callback_on_step_end (step index 0..)."""

    def hook(step: int, total: int, preview: npt.NDArray[np.uint8]) -> None:
        r = cb(pipe, step - 1, None, {"preview": preview})
        if isinstance(r, dict) and set(r) - {"preview"}:
            raise ValueError(f"callback_on_step_end returned {sorted(set(r) - {'preview'})}: klein's denoising loop "
                             "cannot take tensors back from the step callback (return None or callback_kwargs)")

    return hook


def _log(line: str) -> None:
    logger.warning("%s", line)


class Flux2KleinPipeline:
    """A FLUX.2 [klein] model held open by klein.cpp, called as diffusers' Flux2KleinPipeline.

    Open it with :meth:`from_pretrained`. Calls on one pipeline are serialised; the GIL is
    released while the engine computes, and Ctrl-C cancels a running call (the pipeline stays
    usable).
    """

    def __init__(self, model: Any) -> None:
        self._model = model
        self._progress_config: Dict[str, Any] = {}

    # ---- loading ---------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: Union[str, "os.PathLike[str]"],
        *,
        backend: str = "auto",
        precision: str = "fast",
        max_memory: Optional[float] = None,
        threads: Optional[int] = None,
        memory: str = "resident",
        isa: Optional[str] = None,
        vae_tile: Optional[int] = None,
        diffusion_model: Optional[str] = None,
        text_encoder: Optional[str] = None,
        vae: Optional[str] = None,
        model_variant: str = "auto",
        verify: Optional[str] = None,
        **kwargs: Any,
    ) -> "Flux2KleinPipeline":
        """Open a model: a diffusers folder, a single safetensors/GGUF file, an all-in-one
        checkpoint or a quantized folder (every layout `klein generate --model` opens).

        backend: "auto" (CUDA when built with it and a GPU is visible), "cpu" or "cuda".
        precision: "fast" (default: the CPU's bf16/int8 dot products) or "fp32" (float32
            arithmetic: diffusers' float32 pipeline, exactly).
        max_memory: a memory budget in GiB per request (the engine plans every request to fit
            or fails before any work); None: no budget.
        threads: worker threads (None: all cores).
        memory: "resident" (default: the three models stay loaded between calls, as a diffusers
            pipeline does) or "low" (one at a time, loaded for its phase).
        isa, vae_tile: as the CLI's --isa and --vae-tile.
        diffusion_model, text_encoder, vae: separate component files (as the CLI's options).
        model_variant: "auto", "distilled" or "base" (what a single file holds).
        verify: a manifest file (`klein manifest`) the files are checked against first.
        Only the local path is read: nothing is downloaded.
        """
        for k in kwargs:
            if k in _UNSUPPORTED_LOAD_ARGS:
                raise TypeError(f"from_pretrained: {k} is not supported: {_UNSUPPORTED_LOAD_ARGS[k]}")
        if kwargs:
            raise TypeError(f"from_pretrained: unexpected argument(s) {', '.join(sorted(kwargs))}")
        for name, value, allowed in (("backend", backend, _BACKENDS), ("precision", precision, _PRECISIONS),
                                     ("memory", memory, _MEMORY), ("model_variant", model_variant, _VARIANTS)):
            if value not in allowed:
                raise ValueError(f"from_pretrained: {name}={value!r}: expected one of {', '.join(map(repr, allowed))}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
            raise ValueError(f"from_pretrained: threads={threads!r}: expected an int >= 0 (0 or None: all cores)")
        if max_memory is not None and (isinstance(max_memory, bool) or not isinstance(max_memory, (int, float))
                                       or not max_memory > 0):
            raise ValueError(f"from_pretrained: max_memory={max_memory!r}: expected GiB > 0, or None for no budget")
        model = _klein.Model.open(
            os.fspath(pretrained_model_name_or_path), threads=threads or 0, memory=memory, precision=precision,
            backend=backend, max_memory=float(max_memory or 0), isa=isa or "", vae_tile=vae_tile or 0,
            diffusion_model=diffusion_model or "", text_encoder=text_encoder or "", vae=vae or "",
            variant=model_variant, verify_manifest=verify or "")
        for note in model.notes:
            logger.info("%s", note)
        return cls(model)

    # ---- properties ------------------------------------------------------------------------

    @property
    def is_distilled(self) -> bool:
        """False for a base model (guidance and 50 steps by default)."""
        return bool(self._model.distilled)

    @property
    def backend(self) -> str:
        """"cpu" or "cuda": what runs the models."""
        return str(self._model.backend)

    @property
    def precision(self) -> str:
        return str(self._model.precision)

    @property
    def device(self) -> str:
        return self.backend

    def to(self, device: Any) -> "Flux2KleinPipeline":
        """diffusers' pipe.to(device): accepted when the model already runs there."""
        name = str(device).split(":")[0]
        if name != self.backend:
            raise ValueError(f"to({device!r}): this pipeline runs on {self.backend}; open it with "
                             f"from_pretrained(..., backend={name!r}) instead")
        return self

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """tqdm options for the progress bars (disable=True: none), as diffusers."""
        self._progress_config = dict(kwargs)

    def session(self, *, guidance_scale: Optional[float] = None, negative_prompt: str = "") -> "Session":
        """A Session on this model: encode once, denoise and decode several times."""
        return Session(self, guidance_scale=guidance_scale, negative_prompt=negative_prompt)

    def estimate_memory(
        self,
        *,
        height: Optional[int] = None,
        width: Optional[int] = None,
        image_sizes: Sequence[Tuple[int, int]] = (),
        guidance_scale: Optional[float] = None,
    ) -> Dict[str, Any]:
        """What one call of this shape needs in memory, before anything loads: a dict with the
        output size, image/reference tokens, whether CFG runs, ``resident_bytes`` (the fastest
        plan's peak) and ``minimum_bytes`` (the smallest ``max_memory`` budget, in bytes, that runs
        it), and each plan in one line. ``image_sizes``: each reference image's (width, height)."""
        return dict(self._model.estimate_memory(
            width=width or 0, height=height or 0, references=[(int(w), int(h)) for w, h in image_sizes],
            guidance_scale=-1.0 if guidance_scale is None else float(guidance_scale)))

    # ---- encode_prompt ---------------------------------------------------------------------

    def encode_prompt(
        self,
        prompt: Union[str, Sequence[str], None] = None,
        device: Any = None,
        num_images_per_prompt: int = 1,
        prompt_embeds: Any = None,
        max_sequence_length: int = 512,
    ) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """(prompt_embeds [B*N, L, D] float32, text_ids [B*N, L, 4] int64), as diffusers.

        One prompt gives the engine's array itself (no copy)."""
        if prompt_embeds is None:
            prompts = [""] if prompt is None else [prompt] if isinstance(prompt, str) else list(prompt)
            for i, p in enumerate(prompts):
                if not isinstance(p, str):
                    raise TypeError(f"encode_prompt: prompt[{i}] is {type(p).__name__}, expected str")
            if not isinstance(max_sequence_length, int) or not 1 <= max_sequence_length <= 512:
                raise ValueError(f"encode_prompt: max_sequence_length={max_sequence_length!r}: expected 1 .. 512")
            enc = [self._model.encode_prompt(p, max_length=max_sequence_length, log=_log)["prompt_embeds"]
                   for p in prompts]
            embeds = enc[0] if len(enc) == 1 else np.concatenate(enc, axis=0)
        else:
            embeds = _f32(prompt_embeds, "prompt_embeds", 3)
        if not isinstance(num_images_per_prompt, int) or num_images_per_prompt < 1:
            raise ValueError(f"encode_prompt: num_images_per_prompt={num_images_per_prompt!r}: expected an int >= 1")
        if num_images_per_prompt > 1:
            embeds = np.repeat(embeds, num_images_per_prompt, axis=0)
        b, length, _ = embeds.shape
        text_ids = np.zeros((b, length, 4), dtype=np.int64)
        text_ids[:, :, 3] = np.arange(length)
        return embeds, text_ids

    # ---- __call__ --------------------------------------------------------------------------

    def __call__(
        self,
        prompt: Union[str, Sequence[str], None] = None,
        *,
        image: Any = None,
        height: Optional[int] = None,
        width: Optional[int] = None,
        num_inference_steps: Optional[int] = None,
        guidance_scale: Optional[float] = None,
        negative_prompt: Optional[str] = None,
        num_images_per_prompt: int = 1,
        generator: Any = None,
        latents: Any = None,
        prompt_embeds: Any = None,
        negative_prompt_embeds: Any = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Optional[StepCallback] = None,
        callback_on_step_end_tensor_inputs: Optional[Sequence[str]] = None,
        max_sequence_length: int = 512,
        **kwargs: Any,
    ) -> Any:
        """Generate images, as diffusers' Flux2KleinPipeline.__call__.

        prompt: a str or a list of str (or prompt_embeds [B, T, D] instead).
        image: reference image(s) for editing (paths, bytes, uint8 arrays, PIL images).
        height, width: output size (None: the first reference's, else the model's native size, its
            VAE config's sample_size: 1024 for FLUX.2, 128 for the demo model; floored to 16).
        num_inference_steps: None: the model's default (4 distilled, 50 base).
        guidance_scale: classifier-free guidance for base models (None: 4.0); distilled ignore it.
        negative_prompt: guidance's unconditional prompt (default "", as diffusers).
        generator: an int seed, a torch.Generator (initial_seed()) or a list of them, one per
            image; None: a random seed. One generator for several images draws their noise as one
            tensor, as diffusers does, so image i equals diffusers' image i.
        latents: initial noise [B*N, 128, H/16, W/16] (numpy or torch).
        output_type: "pil" (needs Pillow) or "np" (float32 [B, H, W, 3] in [0, 1]).
        callback_on_step_end: called after every step as (pipe, step_index, None,
            {"preview": uint8 array (H, W, 3)}); raising in it cancels the call.
        Returns Flux2PipelineOutput (images, metadata), or (images,) with return_dict=False.
        """
        for k in kwargs:
            if k in _UNSUPPORTED_CALL_ARGS:
                raise TypeError(f"{k} is not supported: {_UNSUPPORTED_CALL_ARGS[k]}")
        if kwargs:
            raise TypeError(f"unexpected argument(s) {', '.join(sorted(kwargs))}")
        if output_type not in ("pil", "np"):
            raise ValueError(f"output_type={output_type!r}: expected 'pil' or 'np'"
                             + (" (for torch: torch.from_numpy on 'np')" if output_type == "pt" else ""))
        if prompt is not None and prompt_embeds is not None:
            raise ValueError("give either prompt or prompt_embeds, not both")
        if prompt is None and prompt_embeds is None:
            raise ValueError("give prompt (a str or a list of str) or prompt_embeds")
        if max_sequence_length != 512:
            raise ValueError(f"max_sequence_length={max_sequence_length!r}: klein's pipeline encodes 512 tokens")
        inputs = list(callback_on_step_end_tensor_inputs or ["preview"])
        if any(k != "preview" for k in inputs):
            raise ValueError(f"callback_on_step_end_tensor_inputs={inputs!r}: klein's step callback gives "
                             "'preview' (an RGB uint8 array of the step's predicted image), not latents")
        if callback_on_step_end is not None and not callable(callback_on_step_end):
            raise TypeError("callback_on_step_end: expected a callable (pipe, step_index, timestep, callback_kwargs)")
        for name, v, lo in (("height", height, 16), ("width", width, 16), ("num_inference_steps", num_inference_steps, 1)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo):
                raise ValueError(f"{name}={v!r}: expected an int >= {lo}, or None for the default")
        if isinstance(num_images_per_prompt, bool) or not isinstance(num_images_per_prompt, int) \
                or num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt={num_images_per_prompt!r}: expected an int >= 1")
        if guidance_scale is not None and (isinstance(guidance_scale, bool)
                                           or not isinstance(guidance_scale, (int, float))
                                           or not 0 <= guidance_scale <= 100):
            raise ValueError(f"guidance_scale={guidance_scale!r}: expected a number from 0 to 100, or None (4.0)")
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            raise TypeError(f"negative_prompt: expected a str, got {type(negative_prompt).__name__}")

        # The prompts (or their embeddings), one per batch row.
        if prompt is not None:
            if not isinstance(prompt, (str, list, tuple)) or (not isinstance(prompt, str) and not prompt):
                raise ValueError(f"prompt: expected a str or a non-empty list of str, got {type(prompt).__name__}")
            prompts: List[Optional[str]] = [prompt] if isinstance(prompt, str) else list(prompt)
            for i, p in enumerate(prompts):
                if not isinstance(p, str):
                    raise TypeError(f"prompt[{i}]: expected a str, got {type(p).__name__}")
            embeds_rows: List[Optional[npt.NDArray[np.float32]]] = [None] * len(prompts)
        else:
            e = _f32(prompt_embeds, "prompt_embeds", 3)
            embeds_rows = [e[i:i + 1] for i in range(e.shape[0])]
            prompts = [None] * e.shape[0]
        negative_rows: List[Optional[npt.NDArray[np.float32]]] = [None] * len(prompts)
        if negative_prompt_embeds is not None:
            ne = _f32(negative_prompt_embeds, "negative_prompt_embeds", 3)
            if ne.shape[0] not in (1, len(prompts)):
                raise ValueError(f"negative_prompt_embeds: batch {ne.shape[0]}, expected 1 or {len(prompts)}")
            negative_rows = [ne[min(i, ne.shape[0] - 1):][:1] for i in range(len(prompts))]
        total = len(prompts) * num_images_per_prompt

        # Seeds or noise per image.
        seeds: List[Optional[int]]
        noise: Optional[npt.NDArray[np.float32]] = None
        one_draw = False
        if latents is not None:
            if generator is not None:
                raise ValueError("give either latents or generator, not both")
            noise = _f32(latents, "latents", 4)
            if noise.shape[0] != total or noise.shape[1] != 128:
                raise ValueError(f"latents: shape {tuple(noise.shape)}, expected ({total}, 128, height/16, width/16) "
                                 f"for {total} image(s)")
            height = height or int(noise.shape[2]) * 16
            width = width or int(noise.shape[3]) * 16
            seeds = [None] * total
        elif isinstance(generator, (list, tuple)):
            if len(generator) != total:
                raise ValueError(f"generator: a list of {len(generator)} generators for {total} image(s) "
                                 f"({len(prompts)} prompt(s) x num_images_per_prompt={num_images_per_prompt})")
            seeds = [_seed_of(g, f"generator[{i}]") for i, g in enumerate(generator)]
        else:
            seed = random.getrandbits(63) if generator is None else _seed_of(generator)
            seeds = [seed] * total
            one_draw = total > 1

        paths, data, ref_names = _references(image)
        gs = -1.0 if guidance_scale is None else float(guidance_scale)
        neg = negative_prompt or ""
        session = _klein.Session(self._model, guidance_scale=gs, negative_prompt=neg)
        progress = _Progress(self._progress_config)
        if paths or data:
            session.set_references(paths, data)

        images: List[npt.NDArray[np.uint8]] = []
        batch_noise: Optional[npt.NDArray[np.float32]] = None
        metadata: List[List[Tuple[str, str]]] = []
        try:
            for b, (p, er, nr) in enumerate(zip(prompts, embeds_rows, negative_rows)):
                if p is not None:
                    session.encode_prompt(p, progress=progress, log=_log)
                else:
                    assert er is not None
                    session.set_prompt_embeddings(er, nr, progress=progress, log=_log)
                for j in range(num_images_per_prompt):
                    i = b * num_images_per_prompt + j
                    step_hook = None if callback_on_step_end is None else _step_hook(self, callback_on_step_end)
                    img_noise = None
                    if noise is not None:
                        img_noise = noise[i:i + 1]
                    elif one_draw and i > 0:
                        # diffusers draws every image's noise from one generator as one tensor:
                        # image i is its i-th slice (image 0, the draw's start, came from the seed).
                        if batch_noise is None:
                            shape = [total, 128, session.height // 16, session.width // 16]
                            batch_noise = _klein.randn(shape, seeds[0] or 0)
                        img_noise = batch_noise[i:i + 1]
                    session.denoise(width=int(width or 0), height=int(height or 0), steps=int(num_inference_steps or 0),
                                    seed=seeds[i] or 0, noise=img_noise, progress=progress, preview=step_hook,
                                    log=_log)
                    images.append(session.decode(progress=progress, log=_log))
                    metadata.append(self._metadata(session, p, seeds[i] if noise is None else None, ref_names, neg))
        finally:
            progress.close()

        out: Any
        if output_type == "np":
            out = np.stack(images).astype(np.float32) / np.float32(255)
        else:
            out = [_to_pil(a) for a in images]
        if not return_dict:
            return (out,)
        return Flux2PipelineOutput(images=out, metadata=metadata)

    def _metadata(self, session: Any, prompt: Optional[str], seed: Optional[int],
                  refs: List[str], negative_prompt: str) -> List[Tuple[str, str]]:
        """What the CLI writes into its PNG for the same request (Model::generate's metadata)."""
        model = os.path.basename(os.path.normpath(self._model.path))
        md = [("prompt", prompt if prompt is not None else "prompt embeddings"),
              ("seed", str(seed) if seed is not None else "latents"),
              ("steps", str(session.steps)), ("size", f"{session.width}x{session.height}"),
              ("precision", self.precision), ("model", model), ("software", f"klein.cpp {_klein.version()}")]
        if session.guided:
            md.append(("guidance scale", f"{session.guidance_scale:g}"))
            md.append(("negative prompt", negative_prompt))
        md += [(f"reference{i + 1}", n) for i, n in enumerate(refs)]
        return md


class Session:
    """One request's state on a pipeline's model: encode the prompt (and reference images) once,
    then denoise and decode with as many seeds as wanted.

        s = pipe.session()
        s.encode_prompt("a red fox")
        for seed in (1, 2, 3):
            s.denoise(generator=seed, height=512, width=512)
            s.decode().save(f"fox-{seed}.png")
    """

    def __init__(self, pipe: Flux2KleinPipeline, *, guidance_scale: Optional[float] = None,
                 negative_prompt: str = "") -> None:
        if not isinstance(pipe, Flux2KleinPipeline):
            raise TypeError(f"Session: expected a Flux2KleinPipeline, got {type(pipe).__name__}")
        self._pipe = pipe
        self._s = _klein.Session(pipe._model, guidance_scale=-1.0 if guidance_scale is None else float(guidance_scale),
                                 negative_prompt=negative_prompt)

    @property
    def guided(self) -> bool:
        """Whether classifier-free guidance runs (base models at a scale > 1)."""
        return bool(self._s.guided)

    @property
    def width(self) -> int:
        return int(self._s.width)

    @property
    def height(self) -> int:
        return int(self._s.height)

    @property
    def steps(self) -> int:
        return int(self._s.steps)

    def encode_prompt(self, prompt: str) -> None:
        """The prompt (and with guidance the negative prompt) through the text encoder."""
        if not isinstance(prompt, str):
            raise TypeError(f"encode_prompt: expected a str, got {type(prompt).__name__}")
        self._s.encode_prompt(prompt, log=_log)

    def set_prompt_embeds(self, prompt_embeds: Any, negative_prompt_embeds: Any = None) -> None:
        """Given embeddings [1, T, D] (e.g. from pipe.encode_prompt) instead of encode_prompt."""
        neg = None if negative_prompt_embeds is None else _f32(negative_prompt_embeds, "negative_prompt_embeds", 3)
        self._s.set_prompt_embeddings(_f32(prompt_embeds, "prompt_embeds", 3), neg, log=_log)

    def set_images(self, image: Any) -> None:
        """Reference images for editing (before the first denoise)."""
        paths, data, _ = _references(image)
        self._s.set_references(paths, data)

    def denoise(self, *, generator: Any = 0, latents: Any = None, height: Optional[int] = None,
                width: Optional[int] = None, num_inference_steps: Optional[int] = None,
                callback: Optional[Callable[[int, int, npt.NDArray[np.uint8]], None]] = None) -> None:
        """The denoising loop from a seed (int or torch.Generator) or given latents.
        callback(step, total, preview) gets each step's preview (uint8 (H, W, 3))."""
        noise = None if latents is None else _f32(latents, "latents", 4)
        self._s.denoise(width=int(width or 0), height=int(height or 0), steps=int(num_inference_steps or 0),
                        seed=0 if noise is not None else _seed_of(generator), noise=noise, preview=callback, log=_log)

    def latents(self) -> npt.NDArray[np.float32]:
        """The last denoise's latents [1, 128, H/16, W/16] (no copy)."""
        return self._s.latents()

    def decode(self, output_type: str = "pil") -> Any:
        """The last denoise's image: PIL (default) or a uint8 array (H, W, 3) with "np"."""
        if output_type not in ("pil", "np"):
            raise ValueError(f"output_type={output_type!r}: expected 'pil' or 'np'")
        arr = self._s.decode(log=_log)
        return _to_pil(arr) if output_type == "pil" else arr
