"""The binding's behaviour around the engine: the GIL, Ctrl-C, memory, errors, typing, examples."""

from __future__ import annotations

import _thread
import os
import pathlib
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

import numpy as np
import pytest

import klein
from conftest import SOURCE, TINY


def test_the_gil_is_released_during_generation(pipe: klein.Flux2KleinPipeline) -> None:
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        # Calls until half a second has passed (one call takes 0.1 s on an idle machine, seconds
        # on a loaded one), so the other thread has time to show how it ran.
        start = time.monotonic()
        calls = 0
        while time.monotonic() - start < 0.5:
            pipe("a red fox", width=512, height=512, num_inference_steps=12, generator=1, output_type="np")
            calls += 1
        elapsed = time.monotonic() - start
        during = ticks
    finally:
        stop.set()
        t.join()
    # Sleeping 1 ms per tick: a thread that ran all along ticks hundreds of times a second; one
    # starved by a held GIL would tick only when a callback lets it (at most about 20 per call).
    assert during > max(100, 3 * 20 * calls, 50 * elapsed), (during, calls, elapsed)


def test_ctrl_c_cancels_within_a_second_and_the_pipeline_stays_usable(pipe: klein.Flux2KleinPipeline) -> None:
    interrupted_at: List[float] = []

    def interrupt() -> None:
        interrupted_at.append(time.monotonic())
        _thread.interrupt_main()  # as Ctrl-C: SIGINT's flag, seen by the waiting main thread

    timer = threading.Timer(0.5, interrupt)
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        pipe("a red fox", width=1024, height=1024, num_inference_steps=50, generator=1, output_type="np")
    raised_at = time.monotonic()
    timer.join()
    assert interrupted_at, "the generation ended before the interrupt"
    assert raised_at - interrupted_at[0] < 1.0, raised_at - interrupted_at[0]
    assert raised_at - start < 5
    out = pipe("a red fox", width=32, height=32, generator=1, output_type="np")
    assert out.images.shape == (1, 32, 32, 3)


def test_an_exception_in_the_step_callback_cancels_and_propagates(pipe: klein.Flux2KleinPipeline) -> None:
    calls: List[int] = []

    def boom(p: Any, i: int, t: Any, kw: Dict[str, Any]) -> None:
        calls.append(i)
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        pipe("a red fox", width=32, height=32, num_inference_steps=4, generator=1, callback_on_step_end=boom)
    assert calls == [0]
    assert pipe("a red fox", width=32, height=32, generator=1, output_type="np").images.shape == (1, 32, 32, 3)


def test_a_step_callback_cannot_hand_back_latents(pipe: klein.Flux2KleinPipeline) -> None:
    with pytest.raises(ValueError, match="cannot take tensors back"):
        pipe("x", width=32, height=32, generator=1, output_type="np",
             callback_on_step_end=lambda p, i, t, kw: {"latents": np.zeros(1)})


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_fifty_calls_do_not_grow_memory(pipe: klein.Flux2KleinPipeline) -> None:
    def call(i: int) -> None:  # a prompt encode, a step with its preview, a decode, the outputs
        out = pipe("a red fox", width=32, height=32, num_inference_steps=1, generator=i, output_type="np",
                   callback_on_step_end=lambda p, i, t, kw: kw)
        assert out.images.shape == (1, 32, 32, 3)

    for i in range(5):  # allocator pools and first-use buffers settle
        call(i)
    before = _rss_mib()
    for i in range(50):
        call(i)
    grown = _rss_mib() - before
    # A leaked image, preview or embedding per call would add 50 x (>= 12 KiB .. 96 KiB) plus the
    # engine's buffers; the allocator's noise is a few MiB.
    assert grown < 8, f"RSS grew {grown:.1f} MiB over 50 calls"


@pytest.mark.parametrize("kwargs, error, message", [
    ({}, ValueError, "give prompt"),
    ({"prompt": "x", "prompt_embeds": np.zeros((1, 4, 48), np.float32)}, ValueError, "not both"),
    ({"prompt": 3}, ValueError, "prompt"),
    ({"prompt": ["a", 3]}, TypeError, "prompt[1]"),
    ({"prompt": "x", "sigmas": [1.0]}, TypeError, "sigmas is not supported"),
    ({"prompt": "x", "mask_image": "m.png"}, TypeError, "inpainting"),
    ({"prompt": "x", "foo": 1}, TypeError, "unexpected argument(s) foo"),
    ({"prompt": "x", "output_type": "pt"}, ValueError, "torch.from_numpy"),
    ({"prompt": "x", "output_type": "latent"}, ValueError, "output_type='latent'"),
    ({"prompt": "x", "height": 0}, ValueError, "height=0"),
    ({"prompt": "x", "num_inference_steps": 2.5}, ValueError, "num_inference_steps"),
    ({"prompt": "x", "guidance_scale": -1}, ValueError, "guidance_scale"),
    ({"prompt": "x", "num_images_per_prompt": 0}, ValueError, "num_images_per_prompt"),
    ({"prompt": "x", "generator": "seed"}, TypeError, "generator"),
    ({"prompt": "x", "generator": -1}, ValueError, "out of range"),
    ({"prompt": "x", "generator": [1, 2]}, ValueError, "a list of 2 generators for 1 image"),
    ({"prompt": "x", "latents": np.zeros((1, 128, 2), np.float32)}, ValueError, "latents"),
    ({"prompt": "x", "latents": np.zeros((1, 128, 2, 2), np.int32)}, TypeError, "floating-point"),
    ({"prompt": "x", "latents": np.zeros((1, 128, 2, 2), np.float32), "generator": 1}, ValueError, "not both"),
    ({"prompt": "x", "image": 3.5}, TypeError, "image[0]"),
    ({"prompt": "x", "image": np.zeros((8, 8, 3), np.float32)}, TypeError, "uint8"),
    ({"prompt": "x", "callback_on_step_end_tensor_inputs": ["latents"]}, ValueError, "'preview'"),
    ({"prompt": "x", "max_sequence_length": 256}, ValueError, "512"),
])
def test_bad_arguments_raise_clearly(pipe: klein.Flux2KleinPipeline, kwargs: Dict[str, Any], error: type,
                                     message: str) -> None:
    with pytest.raises(error) as e:
        pipe(**kwargs)
    assert message in str(e.value)


def test_engine_errors_are_klein_errors_with_the_engine_message(pipe: klein.Flux2KleinPipeline,
                                                                 tmp_path: pathlib.Path) -> None:
    with pytest.raises(klein.NotFoundError) as e:
        klein.Flux2KleinPipeline.from_pretrained(tmp_path / "missing")
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, klein.Error)
    assert e.value.code == "not found" and "missing" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(klein.InvalidArgumentError, match="latents"):  # the engine's shape check
        pipe("x", width=64, height=64, latents=np.zeros((1, 128, 2, 2), np.float32))
    with pytest.raises(klein.InvalidArgumentError, match="prompt embeddings"):
        pipe(prompt_embeds=np.zeros((1, 4, 7), np.float32))
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(klein.Error, match="bad.png"):
        pipe("x", image=str(bad))
    with pytest.raises(TypeError, match="torch_dtype"):
        klein.Flux2KleinPipeline.from_pretrained(TINY, torch_dtype="bfloat16")
    with pytest.raises(ValueError, match="precision='fp16'"):
        klein.Flux2KleinPipeline.from_pretrained(TINY, precision="fp16")
    with pytest.raises(ValueError, match="backend='cuda'"):
        pipe.to("cuda")
    assert pipe.to("cpu") is pipe and pipe.precision == "fast"  # the engine's default


def test_pil_is_optional(pipe: klein.Flux2KleinPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # `import PIL` now fails, as without Pillow
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    out = pipe("x", width=32, height=32, generator=1, output_type="np")
    assert out.images.shape == (1, 32, 32, 3)
    with pytest.raises(ImportError, match="output_type='np' works without it"):
        pipe("x", width=32, height=32, generator=1)


def test_progress_is_silent_without_tqdm(pipe: klein.Flux2KleinPipeline, capfd: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    pipe.set_progress_bar_config()
    try:
        pipe("x", width=32, height=32, generator=1, output_type="np")
    finally:
        pipe.set_progress_bar_config(disable=True)
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


EXAMPLES = sorted((SOURCE / "python" / "examples").glob("*.py"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_run(example: pathlib.Path, tmp_path: pathlib.Path) -> None:
    env = dict(os.environ, KLEIN_MODEL=str(TINY), KLEIN_THREADS="2")
    r = subprocess.run([sys.executable, str(example)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.glob("*.png")), "the example wrote no image"


def test_examples_and_package_pass_mypy_strict(tmp_path: pathlib.Path) -> None:
    """The examples against the package's stubs and annotations (python/klein: its .py files and
    _klein.pyi, the extension's stub), as a user's `mypy --strict` sees them."""
    pytest.importorskip("mypy")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path),
                        *map(str, EXAMPLES), str(SOURCE / "python" / "klein")],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_extension_stub_names_every_binding() -> None:
    """_klein.pyi (what mypy sees) and the compiled module define the same names."""
    import ast

    from klein import _klein

    stub = ast.parse((SOURCE / "python" / "klein" / "_klein.pyi").read_text())
    stubbed = {n.name for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    compiled = {n for n in dir(_klein) if not n.startswith("_")}
    assert stubbed == compiled
    for cls in ("Model", "Session"):
        node = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == cls)
        members = {m.name for m in node.body if isinstance(m, ast.FunctionDef)} - {"__init__"}
        assert members == {n for n in dir(getattr(_klein, cls)) if not n.startswith("_")}, cls


def test_a_session_used_from_two_threads_waits_without_deadlock(pipe: klein.Flux2KleinPipeline) -> None:
    s = pipe.session()
    s.encode_prompt("x")
    s.denoise(generator=1, width=32, height=32, num_inference_steps=1)
    previews: List[int] = []
    t = threading.Thread(target=lambda: s.denoise(generator=2, width=512, height=512, num_inference_steps=8,
                                                  callback=lambda step, total, img: previews.append(step)))
    t.start()
    time.sleep(0.2)
    latents = s.latents()  # waits for the other thread's denoise, whose previews need the GIL
    t.join(timeout=120)
    assert not t.is_alive()
    assert latents.shape in ((1, 128, 2, 2), (1, 128, 32, 32)) and previews == list(range(1, 9))
