"""Monocular depth maps for ZeST's depth ControlNet (transformers DPT / Depth Anything).

ZeST feeds the depth ControlNet the depth of the whole colour target, min-max normalised per image and stored as
8 bits. The official code scales to 16 bits first and divides by 256, i.e. ``floor(65535 * d / 256)`` for the
normalised depth ``d`` in [0, 1]; `normalise_depth` does exactly that.
"""
from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from pipelines.data import to_rgb
from pipelines.hub_ids import DPT_ID
from pipelines.runtime import load_pretrained, resolve_device, resolve_dtype

DEFAULT_DEPTH_MODEL = DPT_ID


def normalise_depth(depth: np.ndarray) -> Image.Image:
    """Min-max normalise one depth/disparity map to an 8-bit 'L' image (ZeST's 16-bit-then-/256 rounding).

    A constant map gives an all-zero image.
    """
    depth = np.asarray(depth, dtype=np.float64)
    low, high = depth.min(), depth.max()
    if high - low <= np.finfo(np.float64).eps:
        return Image.fromarray(np.zeros(depth.shape, dtype=np.uint8), mode="L")
    sixteen_bit = 65535.0 * (depth - low) / (high - low)
    return Image.fromarray((sixteen_bit / 256.0).astype(np.uint8), mode="L")


@dataclass
class DepthEstimator:
    """A transformers depth model (`AutoModelForDepthEstimation`) with its image processor."""

    model: Any
    processor: Any
    model_id: str
    batch_size: int = 8

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike = DEFAULT_DEPTH_MODEL,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        batch_size: int = 8,
    ) -> DepthEstimator:
        """Load a hub id or local folder (DPT, DPT-hybrid, Depth Anything); fp32 unless `dtype` says otherwise (ZeST's
        code runs DPT in fp32; a dtype name follows the runtime policy)."""
        from transformers import AutoImageProcessor, AutoModelForDepthEstimation

        device = resolve_device(device)
        if dtype is None:
            dtype = torch.float32
        elif isinstance(dtype, str):
            dtype = resolve_dtype(dtype, device)
        model = load_pretrained(AutoModelForDepthEstimation.from_pretrained, name_or_path, "depth model", dtype=dtype)
        processor = load_pretrained(AutoImageProcessor.from_pretrained, name_or_path, "depth image processor")
        return cls(model.to(device).eval(), processor, str(name_or_path), batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def predict(self, images: Sequence[Image.Image]) -> list[np.ndarray]:
        """Raw predicted depth of each image, resized (bicubic) to the image's own size, float32 [H, W]."""
        rgb = [to_rgb(image) for image in images]
        pixels = [self.processor(images=image, return_tensors="pt")["pixel_values"][0] for image in rgb]
        by_shape: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for index, tensor in enumerate(pixels):
            by_shape[tuple(tensor.shape)].append(index)
        dtype = next(self.model.parameters()).dtype
        depths: list[np.ndarray | None] = [None] * len(rgb)
        for indices in by_shape.values():
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                batch = torch.stack([pixels[i] for i in chunk]).to(self.device, dtype)
                predicted = self.model(pixel_values=batch).predicted_depth.float()
                for row, i in enumerate(chunk):
                    width, height = rgb[i].size
                    resized = F.interpolate(predicted[row][None, None], size=(height, width), mode="bicubic",
                                            align_corners=False)
                    depths[i] = resized[0, 0].cpu().numpy()
        return depths  # type: ignore[return-value]

    def __call__(self, images: Sequence[Image.Image]) -> list[Image.Image]:
        """Batched depth maps as 8-bit 'L' images at each image's size, min-max normalised per image."""
        return [normalise_depth(depth) for depth in self.predict(images)]
