"""Tiny models shared by the generative-detector tests (saved and reloaded through the real loading code)."""
from __future__ import annotations

import pytest
from helpers.models import small_conv_classifier

from benchmarks.cases.diffguard import contrast_ramp_images
from pipelines.classifier import ImageClassifier


@pytest.fixture(autouse=True)
def _single_thread(single_torch_thread):
    """Every generative test runs on one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def tiny_classifier() -> ImageClassifier:
    return small_conv_classifier()


@pytest.fixture(scope="session")
def pixel_unet_folder(tmp_path_factory):
    from pipelines.tiny import save_tiny_pixel_unet

    return save_tiny_pixel_unet(tmp_path_factory.mktemp("pixel_unet"))


@pytest.fixture(scope="session")
def pixel_unet(pixel_unet_folder):
    from diffusers import UNet2DModel

    return UNet2DModel.from_pretrained(pixel_unet_folder).eval()


@pytest.fixture(scope="session")
def sd_folder(tmp_path_factory):
    from pipelines.tiny import save_tiny_stable_diffusion

    return save_tiny_stable_diffusion(tmp_path_factory.mktemp("tiny_sd"))


@pytest.fixture(scope="session")
def synthetic():
    """Smooth colour waves of increasing contrast (their inversions stop at different steps)."""
    return contrast_ramp_images
