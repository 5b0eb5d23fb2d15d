"""Flux2KleinPipeline against the CLI and the diffusers fixtures (tiny random-weight model)."""

from __future__ import annotations

import json
import pathlib
import subprocess
from typing import Any, Dict, List

import numpy as np
import pytest

import klein
from conftest import REF, TINY


def test_png_is_byte_identical_to_the_cli(pipe: klein.Flux2KleinPipeline, cli: str, tmp_path: pathlib.Path) -> None:
    cli_png = tmp_path / "cli.png"
    subprocess.run([cli, "generate", "-m", str(TINY), "-p", "a red fox", "-W", "48", "-H", "32", "--seed", "7",
                    "-t", "2", "-q", "-o", str(cli_png)], check=True, capture_output=True)
    out = pipe("a red fox", width=48, height=32, generator=7, output_type="np")
    assert out.images.shape == (1, 32, 48, 3) and out.images.dtype == np.float32
    py_png = tmp_path / "py.png"
    klein.save_png(py_png, np.round(out.images[0] * 255).astype(np.uint8), out.metadata[0])
    assert py_png.read_bytes() == cli_png.read_bytes()
    # The PIL output holds the same pixels.
    pil = pipe("a red fox", width=48, height=32, generator=7).images[0]
    assert np.array_equal(np.asarray(pil), klein.decode_image(cli_png.read_bytes()))


def _t2i_cases() -> List[Dict[str, Any]]:
    manifest = json.loads((REF / "manifest.json").read_text())
    return [c for c in manifest["cases"] if c["kind"] == "t2i" and c["dtype"] == "float32"]


@pytest.mark.parametrize("case", _t2i_cases(), ids=lambda c: str(c["name"]))
def test_equals_the_diffusers_pipeline(pipe_fp32: klein.Flux2KleinPipeline, case: Dict[str, Any]) -> None:
    """diffusers' Flux2KleinPipeline (float32) output, 8-bit: the C++ test's bound (tests/test_generate.cpp)."""
    d = REF / case["dir"]
    refs = [str(d / f) for f in case.get("refs", [])]
    out = pipe_fp32(case["prompt"], image=refs or None, width=case.get("width_arg", case["width"]),
                    height=case.get("height_arg", case["height"]), num_inference_steps=case["num_inference_steps"],
                    generator=case["seed"], output_type="np")
    got = np.round(out.images[0] * 255).astype(np.int16)
    want = np.load(d / "image_u8.npy").astype(np.int16).reshape(got.shape)
    diff = np.abs(got - want)
    assert diff.max() <= 1
    assert (diff == 0).mean() >= 0.999


def test_encode_prompt_equals_diffusers_without_a_copy(pipe_fp32: klein.Flux2KleinPipeline) -> None:
    embeds, text_ids = pipe_fp32.encode_prompt("A cat holding a sign that says hello world")
    want = np.load(REF / "te_cat" / "prompt_embeds.npy")
    assert embeds.shape == want.shape == (1, 512, 48) and embeds.dtype == np.float32
    assert np.abs(embeds - want).max() <= 1e-4 * np.abs(want).max()
    assert not embeds.flags.owndata  # the engine's own buffer, not a copy
    assert text_ids.shape == (1, 512, 4) and list(text_ids[0, 5]) == [0, 0, 0, 5]
    two, _ = pipe_fp32.encode_prompt(["a", "b"], num_images_per_prompt=2)
    assert two.shape == (4, 512, 48) and np.array_equal(two[0], two[1]) and not np.array_equal(two[1], two[2])


def test_session_encodes_once_for_several_seeds(pipe: klein.Flux2KleinPipeline) -> None:
    s = pipe.session()
    s.encode_prompt("a red fox")
    for seed in (3, 4):
        s.denoise(generator=seed, width=32, height=48)
        assert (s.width, s.height, s.steps) == (32, 48, 4)
        assert s.latents().shape == (1, 128, 3, 2)
        img = s.decode("np")
        want = pipe("a red fox", width=32, height=48, generator=seed, output_type="np").images[0]
        assert np.array_equal(img, np.round(want * 255).astype(np.uint8))


def test_batches_draw_noise_as_diffusers(pipe: klein.Flux2KleinPipeline) -> None:
    # One generator for a batch: one torch.randn draw, image i its i-th slice; the slice 0 of a
    # batch is the single image's noise.
    assert np.array_equal(klein.randn([3, 128, 2, 2], 11)[:1], klein.randn([1, 128, 2, 2], 11))
    out = pipe(["a red fox", "a cat"], num_images_per_prompt=2, width=32, height=32, generator=11, output_type="np")
    assert out.images.shape == (4, 32, 32, 3) and len(out.metadata) == 4
    single = pipe("a red fox", width=32, height=32, generator=11, output_type="np").images[0]
    assert np.array_equal(out.images[0], single)
    noise = klein.randn([4, 128, 2, 2], 11)
    again = pipe(["a red fox", "a cat"], num_images_per_prompt=2, latents=noise, output_type="np")
    assert np.array_equal(again.images, out.images)
    # A list of generators: one seed per image, as diffusers' list of generators.
    listed = pipe("a red fox", num_images_per_prompt=2, width=32, height=32, generator=[11, 12], output_type="np")
    assert np.array_equal(listed.images[0], single)
    assert not np.array_equal(listed.images[1], out.images[1])


def test_prompt_embeds_give_the_prompts_image(pipe: klein.Flux2KleinPipeline) -> None:
    embeds, _ = pipe.encode_prompt("a red fox")
    a = pipe(prompt_embeds=embeds, width=32, height=32, generator=5, output_type="np")
    b = pipe("a red fox", width=32, height=32, generator=5, output_type="np")
    assert np.array_equal(a.images, b.images)
    assert a.metadata[0][0] == ("prompt", "prompt embeddings")


def test_step_callback_gets_numpy_previews(pipe: klein.Flux2KleinPipeline) -> None:
    seen: List[Any] = []

    def on_step(p: Any, i: int, t: Any, kw: Dict[str, Any]) -> Dict[str, Any]:
        seen.append((p, i, kw["preview"].shape, kw["preview"].dtype))
        return kw

    pipe("a red fox", width=48, height=32, num_inference_steps=3, generator=1, output_type="np",
         callback_on_step_end=on_step)
    assert seen == [(pipe, i, (32, 48, 3), np.uint8) for i in range(3)]


def test_reference_images_from_memory_equal_files(pipe: klein.Flux2KleinPipeline) -> None:
    path = REF / "edit1_auto" / "ref0.png"
    pixels = klein.decode_image(path.read_bytes())
    a = pipe("x", image=str(path), generator=2, output_type="np").images
    b = pipe("x", image=pixels, generator=2, output_type="np").images
    c = pipe("x", image=[path.read_bytes()], generator=2, output_type="np").images
    assert np.array_equal(a, b) and np.array_equal(a, c)
    pil = pytest.importorskip("PIL.Image")
    d = pipe("x", image=pil.fromarray(pixels), generator=2, output_type="np").images
    assert np.array_equal(a, d)


def test_quantize_and_compare(pipe: klein.Flux2KleinPipeline, tmp_path: pathlib.Path) -> None:
    q8 = tmp_path / "tiny-q8"
    klein.quantize(TINY, q8, type="q8", threads=2)
    qpipe = klein.Flux2KleinPipeline.from_pretrained(q8, threads=2)
    qpipe.set_progress_bar_config(disable=True)
    a = pipe("a red fox", width=32, height=32, generator=1).images[0]
    b = qpipe("a red fox", width=32, height=32, generator=1).images[0]
    same = klein.compare(a, a)
    assert isinstance(same, klein.ImageComparison) and same.psnr == float("inf")
    close = klein.compare(a, b)
    assert isinstance(close, klein.ImageComparison) and 0.5 < close.correlation <= 1
    arr = klein.compare(np.ones(4, np.float32), np.full(4, 2, np.float32))
    assert isinstance(arr, klein.ArrayComparison) and arr.max_abs == 1 and arr.numel == 4
    with pytest.raises(klein.InvalidArgumentError):  # the output exists
        klein.quantize(TINY, q8)


def test_estimate_memory_before_anything_loads(pipe: klein.Flux2KleinPipeline) -> None:
    e = pipe.estimate_memory(image_sizes=[(512, 256), (64, 64)])
    assert (e["width"], e["height"]) == (512, 256)  # the first reference's size
    assert e["reference_tokens"] == 32 * 16 + 4 * 4
    assert e["guidance"] is False
    assert 0 < e["minimum_bytes"] <= e["resident_bytes"]
    assert "transformer whole" in e["resident_plan"]
    plain = pipe.estimate_memory(height=64, width=48)
    assert (plain["width"], plain["height"], plain["image_tokens"]) == (48, 64, 12)
    with pytest.raises(klein.InvalidArgumentError):
        pipe.estimate_memory(image_sizes=[(0, 10)])
