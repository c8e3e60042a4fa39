"""Image transforms of classifier training, in PIL + torch (no torchvision), as the reference recipes do them.

Training: `RandomResizedCrop` (area scale (0.08, 1), aspect ratio (3/4, 4/3), ten tries then a centre crop, bilinear)
and a horizontal flip with probability 0.5. Evaluation: `ResizeCenterCrop` (shorter side to `size / crop_pct`, 0.875 as
ImageNet's 256 -> 224, then a centre crop of `size`), which is what a ConvNext-style image processor (the one
`microsoft/resnet-50` ships) does at sizes under 384. Both return uint8 [3,H,W] tensors; normalisation happens on the
device, on whole batches (`Normalize`). Randomness comes from a NumPy generator seeded per (seed, epoch, row), so an
image's crop does not depend on the worker, the process or a resume.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from PIL import Image


def to_uint8_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image -> uint8 tensor [3,H,W]."""
    return torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()


class RandomResizedCrop:
    """Crop a random area share in `scale` with a log-uniform aspect ratio in `ratio`, resize to size x size, flip with
    probability `flip`."""

    def __init__(self, size: int, scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 flip: float = 0.5, resample: int = Image.BILINEAR):
        self.size, self.scale, self.ratio, self.flip, self.resample = int(size), scale, ratio, flip, resample

    def box(self, width: int, height: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        """(left, top, w, h) of the crop (torchvision's sampling rule)."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
        aspect = width / height
        if aspect < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif aspect > max(self.ratio):
            w, h = int(round(height * max(self.ratio))), height
        else:
            w, h = width, height
        return (width - w) // 2, (height - h) // 2, w, h

    def __call__(self, image: Image.Image, rng: np.random.Generator) -> torch.Tensor:
        left, top, w, h = self.box(*image.size, rng)
        out = image.resize((self.size, self.size), self.resample, box=(left, top, left + w, top + h))
        if rng.random() < self.flip:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return to_uint8_tensor(out)


class ResizeCenterCrop:
    """Shorter side to `round(size / crop_pct)` (`size` itself when crop_pct is 1), then the centre size x size."""

    def __init__(self, size: int, crop_pct: float = 0.875, resample: int = Image.BICUBIC):
        self.size, self.crop_pct, self.resample = int(size), float(crop_pct), resample

    def __call__(self, image: Image.Image, rng: np.random.Generator | None = None) -> torch.Tensor:
        short = int(self.size / self.crop_pct)
        width, height = image.size
        new = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
        image = image.resize(new, self.resample)
        left, top = (new[0] - self.size) // 2, (new[1] - self.size) // 2
        return to_uint8_tensor(image.crop((left, top, left + self.size, top + self.size)))


class Normalize:
    """uint8 [B,3,H,W] on any device -> float (x / 255 - mean) / std, in channels-last memory when asked."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], channels_last: bool = False):
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.channels_last = channels_last

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8:
            return x
        mean, std = self.mean.to(x.device), self.std.to(x.device)
        out = (x.float() / 255.0 - mean) / std
        return out.contiguous(memory_format=torch.channels_last) if self.channels_last else out
