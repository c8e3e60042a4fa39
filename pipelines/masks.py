"""Binary foreground masks for ZeST targets and ZeST's grayscale-foreground init image.

Three sources, one output format (PIL 'L', 0 = background, 255 = foreground, at the image's size):

- given mask files or images (`load_mask`), thresholded;
- rembg (`rembg_mask`, optional extra ``oodforge[masks]``), the official ZeST choice; its alpha is thresholded;
- an OpenCV fallback needing no weights (`opencv_mask`): GrabCut on a downscaled copy, initialised with the border band
  (``margin`` of each side) as sure background and the rest as probable foreground, so that the colour models start
  from "the border is background"; the result keeps the largest connected component and fills its holes. It suits
  object-centred photos on a fairly uniform background (product shots, museum objects); objects that touch the
  border lose the part inside the band.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Sequence

import cv2
import numpy as np
from PIL import Image

from pipelines.data import to_rgb

MASK_METHODS = ("auto", "rembg", "opencv")


def binarise(mask: np.ndarray | Image.Image, threshold: int = 128) -> Image.Image:
    """A mask as a binary 'L' image: 255 where the value is >= `threshold` (alpha of RGBA/LA, else luminance)."""
    if isinstance(mask, Image.Image):
        if mask.mode in ("RGBA", "LA", "PA"):
            mask = mask.getchannel("A")
        mask = np.asarray(mask.convert("L"))
    values = np.asarray(mask)
    if values.ndim == 3:
        values = values[..., -1] if values.shape[-1] in (2, 4) else values.mean(axis=-1)
    return Image.fromarray(np.where(values >= threshold, 255, 0).astype(np.uint8), mode="L")


def load_mask(source: str | os.PathLike | Image.Image, size: tuple[int, int] | None = None,
              threshold: int = 128) -> Image.Image:
    """A given mask (file or image) as a binary 'L' image, resized (nearest) to `size` = (width, height) if given."""
    if isinstance(source, Image.Image):
        image = source
    else:
        with Image.open(source) as opened:
            opened.load()
            image = opened.copy()
    mask = binarise(image, threshold)
    if size is not None and mask.size != tuple(size):
        mask = mask.resize(tuple(size), Image.NEAREST)
    return mask


def rembg_available() -> bool:
    """True when the optional `rembg` package is importable."""
    return importlib.util.find_spec("rembg") is not None


def rembg_mask(image: Image.Image, threshold: int = 1) -> Image.Image:
    """Foreground by rembg (ZeST's choice): its alpha channel thresholded (alpha >= 1 as in the official code)."""
    if not rembg_available():
        raise ImportError("rembg_mask needs the optional package rembg: pip install 'oodforge[masks]'")
    from rembg import remove

    cutout = remove(to_rgb(image))
    return binarise(cutout.convert("RGBA"), threshold)


def _largest_component_filled(mask: np.ndarray) -> np.ndarray:
    """The largest 8-connected foreground component of a 0/1 mask, with its holes filled."""
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    if count <= 1:
        return mask.astype(np.uint8)
    largest = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    component = (labels == largest).astype(np.uint8)
    contours, _ = cv2.findContours(component, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    filled = np.zeros_like(component)
    cv2.drawContours(filled, contours, -1, 1, thickness=cv2.FILLED)
    return filled


def opencv_mask(image: Image.Image, margin: float = 0.05, iterations: int = 5, work_size: int = 256,
                seed: int = 0) -> Image.Image:
    """Weight-free foreground mask: GrabCut with the border band as background (see the module docstring).

    `margin` is the band's width as a fraction of each side, `work_size` the longer side GrabCut runs at.
    """
    if not 0 < margin < 0.5:
        raise ValueError(f"opencv_mask: margin must be in (0, 0.5), got {margin}")
    rgb = np.asarray(to_rgb(image))
    height, width = rgb.shape[:2]
    scale = min(1.0, work_size / max(height, width))
    small = cv2.resize(rgb, (max(1, round(width * scale)), max(1, round(height * scale))), interpolation=cv2.INTER_AREA)
    h, w = small.shape[:2]
    band_y, band_x = max(1, round(h * margin)), max(1, round(w * margin))
    labels = np.full((h, w), cv2.GC_BGD, dtype=np.uint8)
    labels[band_y : h - band_y, band_x : w - band_x] = cv2.GC_PR_FGD
    cv2.setRNGSeed(seed)
    background_model, foreground_model = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
    cv2.grabCut(cv2.cvtColor(small, cv2.COLOR_RGB2BGR), labels, None, background_model, foreground_model,
                iterations, cv2.GC_INIT_WITH_MASK)
    foreground = np.isin(labels, (cv2.GC_FGD, cv2.GC_PR_FGD))
    foreground = _largest_component_filled(foreground)
    full = cv2.resize(foreground.astype(np.float32), (width, height), interpolation=cv2.INTER_LINEAR)
    return Image.fromarray(np.where(full >= 0.5, 255, 0).astype(np.uint8), mode="L")


def foreground_mask(image: Image.Image, method: str = "auto") -> Image.Image:
    """One image's foreground: rembg when `method` is 'rembg' (or 'auto' and rembg is installed), else OpenCV."""
    if method not in MASK_METHODS:
        raise ValueError(f"mask method must be one of {MASK_METHODS}, got {method!r}")
    if method == "rembg" or (method == "auto" and rembg_available()):
        return rembg_mask(image)
    return opencv_mask(image)


def foreground_masks(images: Sequence[Image.Image],
                     masks: Sequence[str | os.PathLike | Image.Image | None] | None = None,
                     method: str = "auto") -> list[Image.Image]:
    """Binary masks for `images`: the given mask where one is provided (resized to the image), else `method`."""
    if masks is not None and len(masks) != len(images):
        raise ValueError(f"masks: got {len(masks)} masks for {len(images)} images")
    result = []
    for index, image in enumerate(images):
        given = masks[index] if masks is not None else None
        result.append(foreground_mask(image, method) if given is None else load_mask(given, image.size))
    return result


def grayscale_init(target: Image.Image, mask: Image.Image) -> Image.Image:
    """ZeST's init image: the target's luma (ITU-R 601) inside the mask, the colour target outside it."""
    rgb = to_rgb(target)
    if mask.size != rgb.size:
        raise ValueError(f"grayscale_init: mask size {mask.size} differs from the target's size {rgb.size}")
    colour = np.asarray(rgb)
    gray = np.asarray(rgb.convert("L"))[..., None].repeat(3, axis=-1)
    inside = np.asarray(binarise(mask))[..., None] > 0
    return Image.fromarray(np.where(inside, gray, colour).astype(np.uint8), mode="RGB")

