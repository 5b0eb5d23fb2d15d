"""klein: FLUX.2 [klein] image generation with klein.cpp, behind diffusers' call signature.

    import klein
    pipe = klein.Flux2KleinPipeline.from_pretrained("FLUX.2-klein-4B")
    image = pipe("a red fox in the snow", generator=0).images[0]

Errors from the engine are klein.Error subclasses (InvalidArgumentError, NotFoundError, IoError,
FormatError, UnsupportedError, CancelledError, OutOfMemoryError, InternalError), each also the
builtin exception one would catch for it (ValueError, FileNotFoundError, OSError, ...).
"""

from ._klein import (
    CancelledError,
    Error,
    FormatError,
    InternalError,
    InvalidArgumentError,
    IoError,
    NotFoundError,
    OutOfMemoryError,
    UnsupportedError,
    cpu_info,
)
from ._klein import version as _engine_version
from .pipeline import Flux2KleinPipeline, Flux2PipelineOutput, Session
from .tools import ArrayComparison, ImageComparison, compare, decode_image, encode_image, quantize, randn, save_png

__version__: str = _engine_version()

__all__ = [
    "ArrayComparison",
    "CancelledError",
    "Error",
    "Flux2KleinPipeline",
    "Flux2PipelineOutput",
    "FormatError",
    "ImageComparison",
    "InternalError",
    "InvalidArgumentError",
    "IoError",
    "NotFoundError",
    "OutOfMemoryError",
    "Session",
    "UnsupportedError",
    "compare",
    "cpu_info",
    "decode_image",
    "encode_image",
    "quantize",
    "randn",
    "save_png",
]
