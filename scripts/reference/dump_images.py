#!/usr/bin/env python3
"""Reference-image fixtures for the C++ image reader (src/io/image_reader) and the reference-image
preprocessing (src/pipeline/image_preprocess), made with the REAL Pillow / diffusers code.

1. Writes small test images into tests/data/images/ (PNG in every colour type / bit depth the
   reader handles, JPEG baseline/progressive/subsamplings/grey/CMYK/EXIF+XMP orientations, WebP
   lossy/lossless/alpha/EXIF, odd sizes that force the >1 MPx Lanczos downscale, bad files).
2. For each good image:
     decoded  = diffusers.utils.load_image(path)            (exif_transpose + convert("RGB"))
     tensor   = what Flux2KleinPipeline.__call__ hands to the VAE for that image, captured from
                the real pipeline (tests/data/tiny) by patching prepare_image_latents: i.e.
                check_image_input -> _resize_to_target_area (if w*h > 1024^2) -> //16*16 ->
                image_processor.preprocess(img, height, width, resize_mode="crop")
     out_size = the (height, width) the pipeline then uses for the output (first reference's size
                when height/width are not given), captured from prepare_latents.
   and writes them into tests/data/ref/images/ plus manifest.json.
3. For each bad image: the exception load_image / the pipeline raise (recorded in the manifest).

Storage (kept small): every array has its shape and the CRC-32 (zlib.crc32) of its raw C-order
bytes in the manifest (uint8 HWC for the decoded image, float32 [1,3,H,W] little-endian for the
preprocessed tensor); this is what the C++ test checks for bit-exactness. For diagnostics there
is also the CRC-32 of every row of the uint8 HWC image (row_crc32_hex: 8 hex digits per row) (for the tensor: of the uint8 image u with
tensor == 2*(u/255)-1 in float32 in diffusers' op order, which this script asserts bit-exactly),
and, when small (<= 32 KiB), u itself as <name>.{rgb,pre}.u8.npy; for a few cases (KEEP_F32) the
float32 tensor itself as <name>.pre.npy.

Run from the repository root with the oracle venv (Pillow 13.0.0, diffusers 0.42.1):
    python scripts/reference/dump_images.py            # rewrites tests/data/images, tests/data/ref/images
    python scripts/reference/dump_images.py --verify   # recompute and compare with the manifest
Deterministic: a rerun with the same versions gives byte-identical files.
"""

import argparse
import io
import json
import os
import shutil
import struct
import sys
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402
import PIL  # noqa: E402
import PIL.Image  # noqa: E402
import PIL.PngImagePlugin  # noqa: E402
import torch  # noqa: E402

import diffusers  # noqa: E402
from diffusers import Flux2KleinPipeline  # noqa: E402
from diffusers.utils import load_image  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO_ROOT, "tests", "data")
IMG_DIR = os.path.join(DATA, "images")
REF_DIR = os.path.join(DATA, "ref", "images")
TINY = os.path.join(DATA, "tiny")
U8_NPY_LIMIT = 32 * 1024
KEEP_F32 = {"size_64x64", "png_grey8", "jpg_exif6"}  # full float32 tensors kept as .npy

# --------------------------------------------------------------------------------------------
# Synthetic content: smooth gradients (compress well) + sharp detail (edges, lines, a checker
# patch, a small noise patch) so that Lanczos ringing/clipping and chroma subsampling are hit.
# --------------------------------------------------------------------------------------------


def synth(w, h, seed, noise=True):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 110 * np.sin(2 * np.pi * (x / max(w, 1) * 1.3 + y / max(h, 1) * 0.4) + seed)
    g = 128 + 110 * np.cos(2 * np.pi * (y / max(h, 1) * 1.1) + 0.5 * seed)
    b = 255 * (x + y) / max(w + h - 2, 1)
    img = np.stack([r, g, b], axis=-1)
    # sharp rectangles
    for i in range(6):
        x0, y0 = int(rng.integers(0, max(w - 8, 1))), int(rng.integers(0, max(h - 8, 1)))
        x1 = min(w, x0 + int(rng.integers(4, max(w // 4, 5))))
        y1 = min(h, y0 + int(rng.integers(4, max(h // 4, 5))))
        img[y0:y1, x0:x1] = rng.integers(0, 256, size=3)
    # thin lines (black/white), 1 px
    img[:, ::37] = 0
    img[::29, :] = 255
    # checker patch
    cw, ch = min(48, w // 3), min(48, h // 3)
    cx, cy = w // 2 - cw // 2, h // 2 - ch // 2
    checker = ((np.arange(ch)[:, None] // 2 + np.arange(cw)[None, :] // 2) % 2) * 255
    img[cy : cy + ch, cx : cx + cw] = checker[..., None]
    # small noise patch
    if noise:
        nw, nh = min(24, w // 4), min(24, h // 4)
        img[2 : 2 + nh, 2 : 2 + nw] = rng.integers(0, 256, size=(nh, nw, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------------------------
# A raw PNG writer for what Pillow cannot save (16-bit RGB/RGBA/LA, 2/4-bit, Adam7, odd palettes).
# --------------------------------------------------------------------------------------------


def _chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)


def _pack_rows(samples, depth):
    """samples: (h, w*channels) int array -> list of packed row bytes (big-endian / MSB first)."""
    rows = []
    for row in samples:
        if depth == 16:
            rows.append(row.astype(">u2").tobytes())
        elif depth == 8:
            rows.append(row.astype(np.uint8).tobytes())
        else:
            per = 8 // depth
            pad = (-len(row)) % per
            r = np.concatenate([row, np.zeros(pad, row.dtype)]).reshape(-1, per)
            packed = np.zeros(len(r), np.int64)
            for i in range(per):
                packed |= r[:, i].astype(np.int64) << (8 - depth * (i + 1))
            rows.append(packed.astype(np.uint8).tobytes())
    return rows


def raw_png(samples, w, h, depth, ctype, extra=b"", interlace=False):
    """samples: (h, w, channels) ints. Filter 0 on every row; Adam7 when interlace."""
    s = samples.reshape(h, w, -1)
    raw = b""
    if not interlace:
        raw = b"".join(b"\0" + r for r in _pack_rows(s.reshape(h, -1), depth))
    else:
        for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
                               (1, 0, 2, 2), (0, 1, 1, 2)):
            sub = s[y0::dy, x0::dx]
            if sub.shape[0] == 0 or sub.shape[1] == 0:
                continue
            raw += b"".join(b"\0" + r for r in _pack_rows(sub.reshape(sub.shape[0], -1), depth))
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 1 if interlace else 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + extra
            + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b""))


def exif_bytes(orientation):
    e = PIL.Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def xmp_orientation(o):
    return ('<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
            '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
            'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="%d"/></rdf:RDF>'
            '</x:xmpmeta><?xpacket end="w"?>' % o).encode()


def pil_bytes(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


# --------------------------------------------------------------------------------------------
# The fixture list: name -> bytes. "good" ones must decode; "bad" ones must fail (decode or
# preprocessing).
# --------------------------------------------------------------------------------------------


def make_good():
    g = {}
    rgb = synth(333, 517, 1)
    g["png_rgb8_333x517.png"] = pil_bytes(PIL.Image.fromarray(rgb), "PNG", optimize=True)
    a = synth(96, 80, 2)
    lo = np.random.default_rng(3).integers(0, 256, size=a.shape)
    g["png_rgb16.png"] = raw_png(a.astype(np.int64) * 256 + lo, 96, 80, 16, 2)
    alpha = np.tile(np.linspace(0, 255, 96).astype(np.int64), (80, 1))[..., None]
    g["png_rgba16.png"] = raw_png(np.concatenate([a.astype(np.int64) * 256 + lo, alpha * 257], -1),
                                  96, 80, 16, 6)
    g["png_rgba8.png"] = pil_bytes(PIL.Image.fromarray(np.concatenate(
        [synth(80, 72, 4), alpha[:72, :80].astype(np.uint8)], -1), "RGBA"), "PNG")
    # RGBA with fully transparent pixels whose colour is NOT black (alpha is dropped, not used)
    ra = np.concatenate([synth(72, 64, 5), np.zeros((64, 72, 1), np.uint8)], -1)
    ra[:, :36, 3] = 255
    g["png_rgba8_transparent.png"] = pil_bytes(PIL.Image.fromarray(ra, "RGBA"), "PNG")
    grey = synth(90, 70, 6)[..., 0]
    g["png_grey8.png"] = pil_bytes(PIL.Image.fromarray(grey, "L"), "PNG")
    g["png_grey8_trns.png"] = pil_bytes(PIL.Image.fromarray(grey, "L"), "PNG", transparency=37)
    g["png_rgb8_trns.png"] = pil_bytes(PIL.Image.fromarray(synth(70, 66, 7)), "PNG",
                                       transparency=(0, 0, 0))
    # 16-bit grey opens as I;16 and convert("RGB") clips at 255 (not a rescale): use 0..1000
    g16 = (synth(80, 64, 8)[..., 1].astype(np.int64) * 1000) // 255
    g["png_grey16.png"] = raw_png(g16[..., None], 80, 64, 16, 0)
    g["png_grey4.png"] = raw_png((grey[..., None] >> 4).astype(np.int64), 90, 70, 4, 0)
    g["png_grey2.png"] = raw_png((grey[..., None] >> 6).astype(np.int64), 90, 70, 2, 0)
    g["png_grey1.png"] = pil_bytes(PIL.Image.fromarray(grey > 127), "PNG")
    la = np.stack([grey, 255 - grey], -1)
    g["png_greyalpha8.png"] = pil_bytes(PIL.Image.fromarray(la, "LA"), "PNG")
    g["png_greyalpha16.png"] = raw_png(la.astype(np.int64) * 257 + 100, 90, 70, 16, 4)
    # palette: 8-bit with 200 entries, indices up to 255 (out of range -> black), partial tRNS
    rng = np.random.default_rng(9)
    pal = rng.integers(0, 256, size=(200, 3)).astype(np.uint8)
    idx = (synth(88, 72, 10)[..., 0].astype(np.int64))
    trns = bytes(rng.integers(0, 256, size=50).astype(np.uint8))
    g["png_palette8_trns.png"] = raw_png(idx[..., None], 88, 72, 8, 3,
                                         _chunk(b"PLTE", pal.tobytes()) + _chunk(b"tRNS", trns))
    pal4 = rng.integers(0, 256, size=(16, 3)).astype(np.uint8)
    g["png_palette4.png"] = raw_png((idx[..., None] >> 4), 88, 72, 4, 3, _chunk(b"PLTE", pal4.tobytes()))
    pq = PIL.Image.fromarray(synth(100, 64, 11)).quantize(colors=64)
    g["png_palette_pil_trns.png"] = pil_bytes(pq, "PNG", transparency=3)
    g["png_interlaced.png"] = raw_png(synth(77, 69, 12).astype(np.int64), 77, 69, 8, 2, interlace=True)
    g["png_exif6.png"] = pil_bytes(PIL.Image.fromarray(synth(96, 64, 13)), "PNG", exif=exif_bytes(6))
    # EXIF as ImageMagick's hex "Raw profile type exif" text, and XMP-only orientation (iTXt)
    hexexif = exif_bytes(3).hex()
    info = PIL.PngImagePlugin.PngInfo()
    info.add_text("Raw profile type exif", f"\nexif\n{len(hexexif) // 2:8d}\n{hexexif}\n")
    g["png_rawprofile_exif3.png"] = pil_bytes(PIL.Image.fromarray(synth(96, 64, 25)), "PNG", pnginfo=info)
    info = PIL.PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", xmp_orientation(8).decode())
    g["png_xmp8.png"] = pil_bytes(PIL.Image.fromarray(synth(96, 64, 26)), "PNG", pnginfo=info)
    # JPEG
    j = PIL.Image.fromarray(rgb)
    g["jpg_baseline_333x517.jpg"] = pil_bytes(j, "JPEG", quality=90)
    g["jpg_progressive.jpg"] = pil_bytes(j, "JPEG", quality=85, progressive=True)
    j2 = PIL.Image.fromarray(synth(101, 67, 14))
    g["jpg_444.jpg"] = pil_bytes(j2, "JPEG", quality=92, subsampling=0)
    g["jpg_422.jpg"] = pil_bytes(j2, "JPEG", quality=92, subsampling=1)
    g["jpg_grey.jpg"] = pil_bytes(j2.convert("L"), "JPEG", quality=90)
    g["jpg_cmyk.jpg"] = pil_bytes(j2.convert("CMYK"), "JPEG", quality=90)
    small = PIL.Image.fromarray(synth(96, 64, 15))
    for o in range(1, 9):
        g[f"jpg_exif{o}.jpg"] = pil_bytes(small, "JPEG", quality=90, exif=exif_bytes(o))
    g["jpg_xmp6.jpg"] = pil_bytes(small, "JPEG", quality=90, xmp=xmp_orientation(6))
    # big-endian ("MM") EXIF written by hand: IFD0 with one SHORT Orientation = 5
    be = b"MM\0*" + struct.pack(">I", 8) + struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, 5, 0) \
        + struct.pack(">I", 0)
    g["jpg_exif5_bigendian.jpg"] = pil_bytes(small, "JPEG", quality=90, exif=b"Exif\0\0" + be)
    g["jpg_restart_smooth.jpg"] = pil_bytes(j2, "JPEG", quality=88, restart_marker_rows=1, smooth=30)
    # WebP
    w1 = PIL.Image.fromarray(synth(123, 77, 16))
    g["webp_lossy.webp"] = pil_bytes(w1, "WEBP", quality=80)
    g["webp_lossless.webp"] = pil_bytes(w1, "WEBP", lossless=True)
    wa = PIL.Image.fromarray(np.concatenate([synth(123, 77, 17), np.tile(
        np.linspace(0, 255, 123).astype(np.uint8), (77, 1))[..., None]], -1), "RGBA")
    g["webp_lossy_alpha.webp"] = pil_bytes(wa, "WEBP", quality=80)
    g["webp_lossless_alpha.webp"] = pil_bytes(wa, "WEBP", lossless=True, exact=True)
    g["webp_xmp6.webp"] = pil_bytes(PIL.Image.fromarray(synth(96, 64, 27)), "WEBP", lossless=True,
                                    xmp=xmp_orientation(6))
    g["webp_exif8.webp"] = pil_bytes(PIL.Image.fromarray(synth(96, 64, 18)), "WEBP", quality=80,
                                     exif=exif_bytes(8))
    # sizes
    g["size_1500x1000.jpg"] = pil_bytes(PIL.Image.fromarray(synth(1500, 1000, 19, noise=False)),
                                        "JPEG", quality=80)
    g["size_2400x600.png"] = pil_bytes(PIL.Image.fromarray(synth(2400, 600, 20, noise=False)),
                                       "PNG", optimize=True)
    g["size_1025x1024.jpg"] = pil_bytes(PIL.Image.fromarray(synth(1025, 1024, 21, noise=False)),
                                        "JPEG", quality=75)
    g["size_2048x512.jpg"] = pil_bytes(PIL.Image.fromarray(synth(2048, 512, 22, noise=False)),
                                       "JPEG", quality=75)
    g["size_64x64.png"] = pil_bytes(PIL.Image.fromarray(synth(64, 64, 23)), "PNG")
    g["size_512x64.png"] = pil_bytes(PIL.Image.fromarray(synth(512, 64, 24)), "PNG")
    return g


def make_bad(good):
    b = {}
    png = good["png_rgb8_333x517.png"]
    b["bad_truncated.png"] = png[: len(png) // 2]
    jpg = good["jpg_baseline_333x517.jpg"]
    b["bad_truncated.jpg"] = jpg[: len(jpg) // 2]
    webp = good["webp_lossy.webp"]
    b["bad_truncated.webp"] = webp[: len(webp) // 2]
    b["bad_not_an_image.png"] = b"This is not an image, just some text with a .png name.\n" * 4
    b["bad_empty.jpg"] = b""
    # a valid PNG signature + IHDR claiming 100000 x 100000 RGB, then a tiny IDAT
    b["bad_huge_header.png"] = (b"\x89PNG\r\n\x1a\n"
                                + _chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))
                                + _chunk(b"IDAT", zlib.compress(b"\0" * 100)) + _chunk(b"IEND", b""))
    # a JPEG whose SOF claims 65000 x 65000 (patched into a real small JPEG)
    j = bytearray(good["jpg_444.jpg"])
    i = j.find(b"\xff\xc0")
    struct.pack_into(">HH", j, i + 5, 65000, 65000)
    b["bad_huge_header.jpg"] = bytes(j)
    b["bad_small_32x48.png"] = pil_bytes(PIL.Image.fromarray(synth(32, 48, 30)), "PNG")
    b["bad_aspect_600x64.png"] = pil_bytes(PIL.Image.fromarray(synth(600, 64, 31)), "PNG")
    return b


# --------------------------------------------------------------------------------------------
# The oracle: load_image + the real pipeline's preprocessing, captured.
# --------------------------------------------------------------------------------------------


class _Captured(Exception):
    pass


def load_tiny_pipeline():
    pipe = Flux2KleinPipeline.from_pretrained(TINY, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    cap = {}
    orig_prepare_latents = pipe.prepare_latents

    def prepare_latents(*args, **kwargs):
        cap["height"], cap["width"] = kwargs["height"], kwargs["width"]
        return orig_prepare_latents(*args, **kwargs)

    def prepare_image_latents(images, **kwargs):
        cap["images"] = [im.detach().clone() for im in images]
        raise _Captured()

    pipe.prepare_latents = prepare_latents
    pipe.prepare_image_latents = prepare_image_latents
    te_dim = pipe.transformer.config.joint_attention_dim
    embeds = torch.zeros(1, 8, te_dim)

    def run(pil_image):
        cap.clear()
        try:
            pipe(image=pil_image, prompt_embeds=embeds, num_inference_steps=1, guidance_scale=1.0,
                 output_type="latent")
        except _Captured:
            return cap["images"][0].numpy(), (cap["height"], cap["width"])
        raise RuntimeError("pipeline did not reach prepare_image_latents")

    return run


def crc(a):
    return zlib.crc32(np.ascontiguousarray(a).tobytes()) & 0xFFFFFFFF


def store(arr, stem, u8, keep_f32=False):
    """Manifest entry for one array (uint8 HWC image, or the float32 [1,3,H,W] tensor whose uint8
    image is u8): shape, dtype, crc32 of the raw bytes, crc32 of every row of the uint8 HWC image
    (to find where a mismatch is), and, when small, the uint8 image as .npy (plus the float32
    tensor itself as .npy for keep_f32)."""
    arr = np.ascontiguousarray(arr)
    e = {"shape": list(arr.shape), "dtype": str(arr.dtype), "crc32": crc(arr),
         "row_crc32_hex": "".join("%08x" % crc(r) for r in u8)}
    if u8.nbytes <= U8_NPY_LIMIT:
        fname = stem + ".u8.npy"
        np.save(os.path.join(REF_DIR, fname), np.ascontiguousarray(u8))
        e["u8_npy"] = "ref/images/" + fname
    if keep_f32:
        fname = stem + ".npy"
        np.save(os.path.join(REF_DIR, fname), arr)
        e["npy"] = "ref/images/" + fname
    return e


def tensor_to_u8(t):
    """[1,3,H,W] float32 in [-1,1] -> HWC uint8 u with t == 2*(u/255)-1 exactly (asserted)."""
    u = np.rint((t[0].transpose(1, 2, 0).astype(np.float64) + 1.0) / 2.0 * 255.0).astype(np.uint8)
    back = torch.from_numpy((u.astype(np.float32) / 255.0).transpose(2, 0, 1)[None].copy())
    back = (2.0 * back - 1.0).numpy()
    assert back.dtype == np.float32 and np.array_equal(back.view(np.uint32), t.view(np.uint32)), \
        "preprocessed tensor is not 2*(u/255)-1 of a uint8 image"
    return u


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verify", action="store_true", help="recompute and compare with the manifest")
    args = ap.parse_args()

    good, bad = make_good(), None
    bad = make_bad(good)
    run = load_tiny_pipeline()

    manifest = {
        "about": "see scripts/reference/dump_images.py",
        "versions": {"pillow": PIL.__version__, "diffusers": diffusers.__version__,
                     "torch": torch.__version__, "numpy": np.__version__},
        "crc": "zlib.crc32 of the array's raw C-order bytes (uint8 HWC / float32 [1,3,H,W] LE)",
        "good": [],
        "bad": [],
    }
    if not args.verify:
        for d in (IMG_DIR, REF_DIR):
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
    for name, data in {**good, **bad}.items():
        path = os.path.join(IMG_DIR, name)
        if args.verify:
            with open(path, "rb") as f:
                assert f.read() == data, f"{name}: image bytes differ"
        else:
            with open(path, "wb") as f:
                f.write(data)

    for name, data in good.items():
        path = os.path.join(IMG_DIR, name)
        stem = os.path.splitext(name)[0]
        with PIL.Image.open(path) as raw:
            raw_mode, raw_size = raw.mode, raw.size
            orientation = raw.getexif().get(0x0112)
        img = load_image(path)
        dec = np.array(img)
        assert dec.dtype == np.uint8 and dec.shape == (img.height, img.width, 3)
        t, (oh, ow) = run(img)
        assert t.dtype == np.float32 and t.ndim == 4 and t.shape[:2] == (1, 3)
        e = {
            "name": stem,
            "file": "images/" + name,
            "pil_mode": raw_mode,
            "file_size": list(raw_size),
            "exif_orientation": orientation,
            "decoded": store(dec, stem + ".rgb", dec) if not args.verify else {"crc32": crc(dec)},
            "preprocessed": (store(t, stem + ".pre", tensor_to_u8(t), stem in KEEP_F32)
                             if not args.verify else {"crc32": crc(t)}),
            "output_size": [ow, oh],
        }
        manifest["good"].append(e)
        print(f"{name:28s} {raw_mode:5s} {raw_size} -> decoded {dec.shape[1]}x{dec.shape[0]} -> "
              f"tensor {t.shape[3]}x{t.shape[2]}")

    for name, data in bad.items():
        path = os.path.join(IMG_DIR, name)
        stage, err = None, None
        try:
            img = load_image(path)
            stage = "preprocess"
            run(img)
            stage = None
        except Exception as ex:  # noqa: BLE001
            stage = stage or "decode"
            err = f"{type(ex).__name__}: {ex}"
        assert stage is not None, f"{name}: expected a failure"
        manifest["bad"].append({"name": os.path.splitext(name)[0], "file": "images/" + name,
                                "stage": stage, "python_error": err[:300]})
        print(f"{name:28s} fails at {stage}: {err[:100]}")

    mpath = os.path.join(REF_DIR, "manifest.json")
    if args.verify:
        with open(mpath) as f:
            old = json.load(f)
        for a, b in zip(old["good"], manifest["good"]):
            assert a["decoded"]["crc32"] == b["decoded"]["crc32"], a["name"]
            assert a["preprocessed"]["crc32"] == b["preprocessed"]["crc32"], a["name"]
            assert a["output_size"] == b["output_size"], a["name"]
        print("verify: OK")
        return
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    total = lambda d: sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))  # noqa: E731
    print(f"images: {total(IMG_DIR)} bytes, refs: {total(REF_DIR)} bytes")


if __name__ == "__main__":
    sys.exit(main())
