"""Fixtures for the generation tests: hand-made manifests, a deterministic fake pipeline, tiny ZeST models (built once
per session)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gen.tiny_zest import save_tiny_zest
from gen.zest import ZeSTConfig, ZeSTPipeline
from pipelines.data import make_row, write_manifest


def write_images(folder: Path, names: list[str], seed: int, size: int = 24) -> None:
    """Small RGB PNGs at `folder/name`: a random-coloured textured disc on a plain light background, so that automatic
    masks find an object."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    disc = ((x - size / 2) ** 2 + (y - size / 2) ** 2 < (size / 3) ** 2)[..., None]
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        colour = rng.integers(0, 140, 3)
        texture = np.clip(colour + rng.integers(0, 40, (size, size, 3)), 0, 255)
        background = np.full((size, size, 3), 225) + rng.integers(-3, 4, (size, size, 3))
        Image.fromarray(np.where(disc, texture, background).astype(np.uint8)).save(path)


def bronze_manifest(folder: Path, n: int = 3) -> Path:
    """ID bronze test images with era / category / dynasty metadata."""
    names = [f"bronze_{i}.png" for i in range(n)]
    write_images(folder, names, seed=1)
    rows = [make_row(name, split="test", role="id", label=i % 2, era=f"era{i}", category=f"ding{i}", dynasty=f"dyn{i}")
            for i, name in enumerate(names)]
    write_manifest(folder, rows)
    return folder


def container_manifest(folder: Path, n: int = 7) -> Path:
    """OOD container photos with a category each."""
    names = [f"container_{i}.png" for i in range(n)]
    write_images(folder, names, seed=2)
    rows = [make_row(name, split="test", role="ood", ood_set="container", group="hard", category=f"vase{i}")
            for i, name in enumerate(names)]
    write_manifest(folder, rows)
    return folder


@pytest.fixture
def image_writer():
    """The `write_images` helper, for tests that build their own folders."""
    return write_images


@pytest.fixture
def bronzes(tmp_path: Path) -> Path:
    return bronze_manifest(tmp_path / "bronzes")


@pytest.fixture
def containers(tmp_path: Path) -> Path:
    return container_manifest(tmp_path / "containers")


class FakeZeST:
    """Stands in for ZeSTPipeline: output = target resized, mixed with noise from the item seed and the material mean.

    Counts calls and items; `fail_after` raises on the call after that many batches (an injected crash)."""

    model_ids = {"base": "fake/base", "controlnet": "fake/controlnet"}

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        self.items = 0
        self.fail_after = fail_after

    def __call__(self, targets, materials, masks=None, seeds=None, resolution=32, **params):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("injected crash")
        self.calls += 1
        self.items += len(targets)
        images = []
        for target, material, seed in zip(targets, materials, seeds):
            noise = np.random.default_rng(seed).integers(0, 64, (resolution, resolution, 3))
            base = np.asarray(target.resize((resolution, resolution)), dtype=np.int64) // 2
            tint = np.asarray(material, dtype=np.int64).mean(axis=(0, 1)).astype(np.int64) // 4
            images.append(Image.fromarray(np.clip(base + noise + tint, 0, 255).astype(np.uint8)))
        return images


@pytest.fixture
def fake_zest() -> type[FakeZeST]:
    """The fake pipeline class (instantiate with `fail_after=N` to inject a crash)."""
    return FakeZeST


@pytest.fixture(scope="session")
def tiny_zest_config(tmp_path_factory) -> ZeSTConfig:
    """A `ZeSTConfig` of tiny random-weight components saved in the real folder layouts."""
    with _threads(1):
        return save_tiny_zest(tmp_path_factory.mktemp("tiny_zest"))


@pytest.fixture(scope="session")
def tiny_zest(tiny_zest_config) -> ZeSTPipeline:
    """The tiny ZeST pipeline loaded on the CPU in fp32 through `ZeSTPipeline.from_config`."""
    with _threads(1):
        return ZeSTPipeline.from_config(tiny_zest_config, device="cpu", dtype=torch.float32)


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """Run with `count` torch threads (tiny models are fastest single-threaded on a shared CPU), then restore."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def one_thread():
    """Module-wide single-threaded torch, so repeated model calls are also bitwise identical."""
    with _threads(1):
        yield


@pytest.fixture(scope="session")
def tiny_zest_models(tiny_zest_config) -> dict[str, str]:
    """The tiny ZeST stand-ins' ZeSTConfig as a mapping (gen.tiny_zest.save_tiny_zest, saved once per session)."""
    return tiny_zest_config.to_dict()


@pytest.fixture
def single_thread():
    """One torch thread (as torchrun gives each process): same kernels in and out of process, no oversubscription."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
