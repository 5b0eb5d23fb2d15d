"""Fixtures of the Python package's tests: the tiny random-weight model in tests/data/tiny, the
diffusers reference fixtures in tests/data/ref, and the CLI (KLEIN_CLI) for byte comparisons."""

from __future__ import annotations

import os
import pathlib
from typing import Iterator

import pytest

import klein

SOURCE = pathlib.Path(os.environ.get("KLEIN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
DATA = SOURCE / "tests" / "data"
TINY = DATA / "tiny"
REF = DATA / "ref"


@pytest.fixture(scope="session")
def tiny() -> pathlib.Path:
    return TINY


@pytest.fixture(scope="session")
def cli() -> str:
    path = os.environ.get("KLEIN_CLI", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("KLEIN_CLI is not set to the klein executable (ctest sets it)")
    return path


@pytest.fixture(scope="session")
def pipe() -> Iterator[klein.Flux2KleinPipeline]:
    """The default pipeline (precision fast), two threads: ctest runs other tests beside this."""
    p = klein.Flux2KleinPipeline.from_pretrained(TINY, threads=2)
    p.set_progress_bar_config(disable=True)
    yield p


@pytest.fixture(scope="session")
def pipe_fp32() -> Iterator[klein.Flux2KleinPipeline]:
    """precision fp32: diffusers' float32 pipeline, which the fixtures in tests/data/ref come from."""
    p = klein.Flux2KleinPipeline.from_pretrained(TINY, threads=2, precision="fp32")
    p.set_progress_bar_config(disable=True)
    yield p
