"""Binary foreground masks for ZeST targets and ZeST's grayscale-foreground init image.

Three sources, one output format (PIL 'L', 0 = background, 255 = foreground, at the image's size):

- given mask files or images (`load_mask`, the one loader of the pipeline and the generation job): the alpha channel
  when the mask has one that varies (an RGBA cut-out's transparent background is background), else the luminance (a
  black-and-white mask saved with a constant, e.g. opaque, alpha is read by luminance, with a `MaskWarning`);
  thresholded;
- rembg (`rembg_mask`, optional extra ``oodforge[masks]``), the official ZeST choice (its default u2net model, one
  session per process, created up front by `open_rembg` so that an unreachable model fails once); its alpha is
  thresholded;
- an OpenCV fallback needing no weights (`opencv_mask`): GrabCut on a downscaled copy, initialised with the border band
  (``margin`` of each side) as sure background and the rest as probable foreground, so that the colour models start
  from "the border is background"; the result keeps the largest connected component and fills its holes. It suits
  object-centred photos on a fairly uniform background (product shots, museum objects); objects that touch the
  border lose the part inside the band.

`check_coverage` warns (`MaskWarning`) about masks covering >= 99% or <= 1% of their image: likely a whole-image or a
stray-pixel mask rather than an object.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image, ImageOps

from pipelines.data import MAX_PIXELS, ImageLoadError, to_rgb
from pipelines.errors import UserInputError

log = logging.getLogger(__name__)

MASK_METHODS = ("auto", "rembg", "opencv")
MIN_SIDE = 8  # the OpenCV mask needs a border band and an interior: narrower images are refused, not crashed on
ASPECT_TOLERANCE = 0.01  # a given mask may differ from its image in size (it is resized), not in aspect ratio
COVERAGE_FULL, COVERAGE_TINY = 0.99, 0.01  # foreground shares warned about (not refused)
ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


class MaskError(UserInputError):
    """A mask that cannot be used (wrong aspect ratio, empty, image too small); names the file when there is one."""

    def __init__(self, path: str | os.PathLike | None, reason: str):
        self.path, self.reason = (str(path) if path is not None else None), reason
        super().__init__(f"{path}: {reason}" if path is not None else reason)


class MaskModelError(UserInputError):
    """The automatic mask model cannot run (rembg missing, or its model cannot be loaded): the job stops at start-up."""


class MaskWarning(UserWarning):
    """A usable but suspicious mask; `kind` is `constant_alpha`, `coverage_full` or `coverage_tiny`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit and float single-channel images rescaled to 8-bit 'L' (a plain convert would clip them)."""
    if image.mode not in ("I;16", "I;16B", "I;16L", "I", "F"):
        return image
    values = np.asarray(image, dtype=np.float64)
    if image.mode == "F":
        high = 1.0 if values.max() <= 1.0 else 255.0
    else:
        high = 255.0 if image.mode == "I" and values.max() <= 255 else 65535.0
    return Image.fromarray(np.clip(np.rint(values / high * 255.0), 0, 255).astype(np.uint8), "L")


def binarise(mask: np.ndarray | Image.Image, threshold: int = 128) -> Image.Image:
    """A mask as a binary 'L' image: 255 where the value is >= `threshold`.

    The value is the alpha channel when the mask has one (RGBA, LA, a palette with transparency), else the luminance;
    16-bit masks are rescaled to 8 bits first.
    """
    if isinstance(mask, Image.Image):
        if mask.mode == "P" and "transparency" in mask.info:
            mask = mask.convert("RGBA")
        if mask.mode in ALPHA_MODES:
            mask = mask.getchannel("A")
        mask = np.asarray(_to_8bit(mask).convert("L"))
    values = np.asarray(mask)
    if values.ndim == 3:
        values = values[..., -1] if values.shape[-1] in (2, 4) else values.mean(axis=-1)
    return Image.fromarray(np.where(values >= threshold, 255, 0).astype(np.uint8), mode="L")


def _open_mask(path: Path) -> Image.Image:
    """A mask file as decoded (mode kept, EXIF orientation applied, like `load_image` does for its target)."""
    if not path.is_file():
        raise ImageLoadError(path, "mask file not found")
    if path.stat().st_size == 0:
        raise ImageLoadError(path, "empty mask file (0 bytes)")
    try:
        with Image.open(path) as opened:
            if opened.size[0] * opened.size[1] > MAX_PIXELS:
                raise ImageLoadError(path, f"mask too large: {opened.size[0]}x{opened.size[1]} exceeds "
                                           f"{MAX_PIXELS / 1e6:g} MP")
            opened.load()
            return ImageOps.exif_transpose(opened)
    except ImageLoadError:
        raise
    except Exception as err:
        raise ImageLoadError(path, f"cannot decode mask ({type(err).__name__}: {err})") from err


def load_mask(source: str | os.PathLike | Image.Image, size: tuple[int, int] | None = None,
              threshold: int = 128) -> Image.Image:
    """A given mask (file or image) as a binary 'L' image (see `binarise`), resized (nearest) to `size` = (width,
    height) when given. An unreadable file raises `ImageLoadError`; a mask whose aspect ratio differs from `size` by
    more than 1% raises `MaskError` (it belongs to another image), both naming the file."""
    path = None if isinstance(source, Image.Image) else Path(source)
    mask = binarise(_drop_constant_alpha(source if path is None else _open_mask(path), path), threshold)
    if size is not None and mask.size != tuple(size):
        (width, height), (want_w, want_h) = mask.size, size
        if abs(width / height - want_w / want_h) > ASPECT_TOLERANCE * (want_w / want_h):
            raise MaskError(path, f"mask size {width}x{height} does not match the image size {want_w}x{want_h} "
                                  f"(different aspect ratio)")
        mask = mask.resize(tuple(size), Image.NEAREST)
    return mask


def _drop_constant_alpha(image: Image.Image, path: Path | None) -> Image.Image:
    """A mask image whose alpha channel is constant, as its colour channels (so `binarise` reads the luminance), with
    a `MaskWarning`; any other image unchanged."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode not in ALPHA_MODES:
        return image
    low, high = image.getchannel("A").getextrema()
    if low != high:
        return image
    warnings.warn(MaskWarning("constant_alpha", f"{path or 'mask'}: its alpha channel is constant ({low}), so the "
                                                f"mask is read by luminance"), stacklevel=3)
    return image.convert("RGBA").convert("RGB")


def mask_coverage(mask: Image.Image) -> float:
    """The foreground share of a binary mask, in [0, 1]."""
    return float(np.count_nonzero(np.asarray(mask)) / max(1, mask.size[0] * mask.size[1]))


def check_coverage(mask: Image.Image, where: str | os.PathLike | None = None) -> float:
    """The mask's coverage (`mask_coverage`); warns (`MaskWarning`) when it is >= 99% (likely the whole image) or
    <= 1% (likely stray pixels) but not empty (`is_empty` is the caller's refusal)."""
    coverage = mask_coverage(mask)
    if coverage >= COVERAGE_FULL or 0 < coverage <= COVERAGE_TINY:
        kind = "coverage_full" if coverage >= COVERAGE_FULL else "coverage_tiny"
        warnings.warn(MaskWarning(kind, f"{where or 'mask'}: the mask covers {coverage:.1%} of the image"),
                      stacklevel=2)
    return coverage


def is_empty(mask: Image.Image) -> bool:
    """True when a binary mask has no foreground pixel (ZeST would change nothing)."""
    return not np.asarray(mask).any()


def rembg_available() -> bool:
    """True when the optional `rembg` package is importable."""
    return importlib.util.find_spec("rembg") is not None


@functools.cache
def rembg_session(model: str = "u2net") -> Any:
    """One rembg session per process and model (loading the ONNX model is the expensive part); u2net is rembg's
    default and the one the official ZeST code gets from `remove(image)`."""
    if not rembg_available():
        raise ImportError("rembg masks need the optional package rembg: pip install 'oodforge[masks]'")
    from rembg import new_session

    return new_session(model)


def open_rembg(model: str = "u2net") -> Any:
    """Create the process's rembg session now, so that a missing package or an unreachable model stops a job once at
    start-up (`MaskModelError`, one line) instead of failing every item."""
    try:
        return rembg_session(model)
    except ImportError as err:
        raise MaskModelError(str(err)) from err
    except Exception as err:  # noqa: BLE001 - whatever rembg raises while fetching or loading its model
        raise MaskModelError(
            f"rembg cannot load its {model!r} model ({type(err).__name__}: {err}); it is downloaded on first use into "
            f"$U2NET_HOME (default ~/.u2net): place {model}.onnx there, or use mask_method=opencv or a masks folder"
        ) from err


def rembg_mask(image: Image.Image, threshold: int = 1, model: str = "u2net") -> Image.Image:
    """Foreground by rembg (ZeST's choice): its alpha channel thresholded (alpha >= 1 as in the official code)."""
    from rembg import remove

    cutout = remove(to_rgb(image), session=rembg_session(model))
    return binarise(cutout.convert("RGBA"), threshold)


@functools.cache
def _warn_fallback() -> None:
    """One log line per process (a Python warning would print its source line too, once per worker loop)."""
    log.warning("mask_method 'auto': rembg is not installed, so automatic masks use the OpenCV GrabCut fallback "
                "(pip install 'oodforge[masks]' for ZeST's rembg masks)")


def resolve_mask_method(method: str = "auto") -> str:
    """The method that will run: 'rembg' or 'opencv'. 'auto' is rembg when installed, else OpenCV with a warning
    (once per process); 'rembg' without the package raises `ImportError`."""
    if method not in MASK_METHODS:
        raise ValueError(f"mask method must be one of {MASK_METHODS}, got {method!r}")
    if method == "rembg" and not rembg_available():
        raise ImportError("mask_method 'rembg' needs the optional package rembg: pip install 'oodforge[masks]'")
    if method == "auto":
        if rembg_available():
            return "rembg"
        _warn_fallback()
        return "opencv"
    return method


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
    if min(height, width) < MIN_SIDE:
        raise MaskError(None, f"image too small for an automatic mask: {width}x{height} (each side needs >= "
                              f"{MIN_SIDE} px)")
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
    """One image's foreground by `method` (see `resolve_mask_method`)."""
    return rembg_mask(image) if resolve_mask_method(method) == "rembg" else opencv_mask(image)


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

