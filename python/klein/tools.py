"""klein.quantize, klein.compare and the image helpers (the CLI's quantize / compare commands)."""

from __future__ import annotations

import os
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from . import _klein
from .pipeline import _f32, _log

PathLike = Union[str, "os.PathLike[str]"]


class ImageComparison(NamedTuple):
    """psnr (dB, inf when identical), ssim (mean, BT.601 luma), correlation (Pearson, RGB)."""

    psnr: float
    ssim: float
    correlation: float


class ArrayComparison(NamedTuple):
    """cosine similarity, relative L2 error |a-b|/|a|, max |a-b|, numel: elements compared."""

    cosine: float
    rel_l2: float
    max_abs: float
    numel: int


def _rgb8(x: Any, name: str) -> npt.NDArray[np.uint8]:
    if type(x).__module__.startswith("PIL") and hasattr(x, "convert"):
        x = np.asarray(x.convert("RGB"))
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 3 or x.shape[2] != 3:
        raise TypeError(f"{name}: expected a uint8 RGB array (height, width, 3) or a PIL image")
    return np.ascontiguousarray(x)


def compare(a: Any, b: Any) -> Union[ImageComparison, ArrayComparison]:
    """How close two images or two float arrays are (`klein compare`).

    Paths: images (PNG/JPEG/WebP) or .npy files. Arrays: uint8 (H, W, 3) / PIL images give an
    ImageComparison; float arrays (numpy or torch) an ArrayComparison (`a` is the reference)."""
    if isinstance(a, (str, os.PathLike)) and isinstance(b, (str, os.PathLike)):
        pa, pb = os.fspath(a), os.fspath(b)
        if pa.endswith(".npy") and pb.endswith(".npy"):
            return ArrayComparison(*_klein.compare_npy_files(pa, pb))
        return ImageComparison(*_klein.compare_image_files(pa, pb))
    is_float = [isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating)
                or type(x).__module__.startswith("torch") for x in (a, b)]
    if all(is_float):
        return ArrayComparison(*_klein.compare_arrays(_f32(a, "a"), _f32(b, "b")))
    return ImageComparison(*_klein.compare_images(_rgb8(a, "a"), _rgb8(b, "b")))


def quantize(
    model: PathLike,
    output: PathLike,
    *,
    type: str = "q8",
    flavor: str = "comfy",
    keep: Sequence[str] = (),
    threads: Optional[int] = None,
    diffusion_model: Optional[str] = None,
    text_encoder: Optional[str] = None,
    vae: Optional[str] = None,
    model_variant: str = "auto",
    verify: Optional[str] = None,
) -> None:
    """`klein quantize`: write `model` as a new folder `output` with q8 / q4 / bf16 weights, or its
    transformer as one GGUF file (type="gguf:Q4_K", ...; flavor "comfy" or "sdcpp")."""
    _klein.quantize(os.fspath(model), os.fspath(output), type=type, flavor=flavor, keep=list(keep),
                    threads=threads or 0, diffusion_model=diffusion_model or "", text_encoder=text_encoder or "",
                    vae=vae or "", variant=model_variant, verify_manifest=verify or "", log=_log)


def save_png(path: PathLike, image: Any, metadata: Sequence[Tuple[str, str]] = ()) -> None:
    """Write an RGB image (uint8 array or PIL image) as PNG, atomically, with text metadata:
    with a pipeline output's metadata, the bytes the CLI writes for the same request."""
    _klein.save_png(os.fspath(path), _rgb8(image, "image"), list(metadata))


def encode_image(image: Any, format: str = "png", metadata: Sequence[Tuple[str, str]] = (),
                 quality: int = 90) -> bytes:
    """An RGB image encoded in memory: "png" (with metadata), "jpeg" or "webp"."""
    return _klein.encode_image(_rgb8(image, "image"), format, list(metadata), quality)


def decode_image(data: bytes, name: str = "image") -> npt.NDArray[np.uint8]:
    """PNG/JPEG/WebP bytes as a uint8 RGB array (height, width, 3), as the engine reads references."""
    return _klein.decode_image(bytes(data), name)


def randn(shape: Sequence[int], seed: int, bf16: bool = False) -> npt.NDArray[np.float32]:
    """torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed)) without torch."""
    return _klein.randn(list(shape), seed, bf16)


__all__: List[str] = ["ArrayComparison", "ImageComparison", "compare", "decode_image", "encode_image", "quantize",
                      "randn", "save_png"]
