"""Tiny models shared by the generative-detector tests (saved and reloaded through the real loading code)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from pipelines.classifier import ImageClassifier


class TinyConvNet(nn.Module):
    """conv -> ReLU -> conv -> ReLU -> global average pool -> linear: returns (logits, features)."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x).mean((2, 3))
        return self.fc(features), features


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared machine extra threads only oversubscribe."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_classifier() -> ImageClassifier:
    torch.manual_seed(0)
    return ImageClassifier.from_module(TinyConvNet().eval(), image_size=32).eval()


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
    """The image maker below, for tests."""
    return synthetic_images


def synthetic_images(n: int, size: int = 32, seed: int = 0) -> list[Image.Image]:
    """Smooth images of different contrasts (so that early stop fires at different steps)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = []
    for i in range(n):
        contrast = 0.15 + 0.85 * i / max(n - 1, 1)
        phase = rng.uniform(0, 2 * np.pi, 3)
        img = 0.5 + 0.5 * contrast * np.stack([np.sin(2 * np.pi * (xx + yy) + p) for p in phase], -1)
        out.append(Image.fromarray((img * 255).round().astype(np.uint8)))
    return out
