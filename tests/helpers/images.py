"""Toy images of the detector tests: noisy colour images and the class names they stand for."""
from __future__ import annotations

import numpy as np
from PIL import Image

CLASSES = ["red", "green"]


def colour_images(channels: list[int], n: int, seed: int, size: int = 32) -> list[Image.Image]:
    """`n` noisy images whose listed RGB `channels` are bright (e.g. [0] red, [1] green, [0, 1] yellow)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a = np.zeros((size, size, 3))
        a[..., channels] = 200
        a += rng.normal(0, 20, a.shape)
        out.append(Image.fromarray(np.clip(a, 0, 255).astype("uint8")))
    return out
