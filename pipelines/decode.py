"""How an image file becomes pixels: its header checked, JPEG DCT scaling ("draft") to the size a transform needs,
EXIF orientation and mode conversion at the decoded size, and no other copy.

    with decoded(path, Decode(draft=True), region=lambda w, h: Region((0, 0, w, h), (170, 128))) as image: ...

`region(width, height)` is called once the header is read, with the full size as oriented; it says which box of the
full image an op reads and at what size it writes it (`Region`), so the decoder may pick the coarsest DCT scale
(1/8, 1/4, 1/2) at which that box still has at least the output's pixels. The `Decoded` image maps boxes of the full
image to its own pixels (`Decoded.box`), so an op's geometry is the full-size one whatever the scale. Without draft (or
for formats other than JPEG) the decode is the full one and every box maps to itself.

Each file goes through `path.open("rb")` (a `pathlib.Path` or a shard member: what `Manifest.path` returns).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

MAX_PIXELS = 40_000_000  # decompression-bomb guard of every decode (PIL's own warns at 89 MP and refuses at 179 MP)
DRAFT_SCALES = (8, 4, 2)
"""libjpeg's DCT scalings PIL's `Image.draft` reaches (1/8, 1/4, 1/2), coarsest first."""
DRAFT_HEADROOM = 2.0
"""The decoded box keeps at least this many pixels per output pixel on each axis, so the op's resampling filter still
averages as it would from the full decode (measured in benchmarks/decode.json: at 2 the eval resize of a 3 MP JPEG is
within 3 grey levels of the full decode's, mean 0.4; at 1 within 8, mean 1.4)."""
ORIENTATION_TAG = 0x0112
TRANSPOSES = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}
"""EXIF orientation -> the transpose that shows the image upright (as `PIL.ImageOps.exif_transpose`)."""


class ImageLoadError(OSError):
    """An image that cannot be read or decoded; names the file."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True)
class Decode:
    """How files are decoded: `draft` (JPEG DCT scaling to the size the transform needs; False: full decode),
    `orient` (apply the EXIF orientation; False: the stored pixel order, as PIL's `Image.open` + `convert` gives it)
    and `max_pixels` (the header's limit, None = none)."""

    draft: bool = False
    orient: bool = True
    max_pixels: int | None = MAX_PIXELS

    def identity(self) -> dict[str, Any]:
        """What decides the decoded pixels (for cache keys)."""
        return {"draft": self.draft, "orient": self.orient}


@dataclass(frozen=True)
class Region:
    """The box (left, top, right, bottom) of the full, oriented image an op reads and the (width, height) it writes."""

    box: tuple[float, float, float, float]
    out: tuple[int, int]


class Decoded:
    """A decoded RGB image and how its pixels sit in the full, oriented image (`scale` full pixels per pixel)."""

    def __init__(self, image: Image.Image, full: tuple[int, int], scale: int, orientation: int,
                 raw: tuple[int, int]):
        self.image, self.full, self.scale, self.orientation, self.raw = image, full, scale, orientation, raw

    def box(self, box: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
        """`box` of the full image in this image's pixel coordinates (itself at scale 1). At a coarser scale the
        box goes back through the orientation to the stored frame, is scaled there (the last DCT block may be partial)
        and comes forward through the orientation of the decoded frame."""
        if self.scale == 1:
            return box
        stored = [_unorient(x, y, self.orientation, self.raw) for x, y in ((box[0], box[1]), (box[2], box[3]))]
        decoded_raw = _stored_size(self.image.size, self.orientation)
        corners = [_orient(x / self.scale, y / self.scale, self.orientation, decoded_raw) for x, y in stored]
        (x0, y0), (x1, y1) = corners
        return min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)


def _stored_size(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    """The stored (pre-orientation) size of an image whose oriented size is `size`."""
    return (size[1], size[0]) if orientation in (5, 6, 7, 8) else size


def _orient(x: float, y: float, orientation: int, raw: tuple[int, int]) -> tuple[float, float]:
    """A point of the stored frame (size `raw`) in the oriented frame (continuous coordinates)."""
    w, h = raw
    return {1: (x, y), 2: (w - x, y), 3: (w - x, h - y), 4: (x, h - y), 5: (y, x), 6: (h - y, x),
            7: (h - y, w - x), 8: (y, w - x)}.get(orientation, (x, y))


def _unorient(x: float, y: float, orientation: int, raw: tuple[int, int]) -> tuple[float, float]:
    """A point of the oriented frame in the stored frame of size `raw` (the inverse of `_orient`)."""
    w, h = raw
    return {1: (x, y), 2: (w - x, y), 3: (w - x, h - y), 4: (x, h - y), 5: (y, x), 6: (y, h - x),
            7: (w - y, h - x), 8: (w - y, x)}.get(orientation, (x, y))


def as_source(path: str | os.PathLike | Any) -> Any:
    """A file path as a `pathlib.Path`; an object with `open` and `stat` (a shard member) as it is."""
    return path if hasattr(path, "open") and hasattr(path, "stat") else Path(path)


def orientation_of(image: Image.Image) -> int:
    """The EXIF orientation (1 when absent or unreadable)."""
    try:
        value = image.getexif().get(ORIENTATION_TAG, 1)
    except Exception:  # a malformed EXIF block: the pixels are still fine
        return 1
    return value if value in TRANSPOSES else 1


def dct_scale(region: Region | None, headroom: float = DRAFT_HEADROOM) -> int:
    """The coarsest DCT scale at which `region`'s box keeps at least `headroom` times its output's pixels on both
    axes (1: none does)."""
    if region is None:
        return 1
    width, height = region.box[2] - region.box[0], region.box[3] - region.box[1]
    for scale in DRAFT_SCALES:
        if width / scale >= headroom * region.out[0] and height / scale >= headroom * region.out[1]:
            return scale
    return 1


def to_rgb_mode(image: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Any PIL mode to 8-bit RGB (an RGB image itself, no copy): alpha composited on `background`, CMYK / palette /
    grayscale converted, 16-bit and float images rescaled to 0-255. Orientation is not touched."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        arr = np.asarray(image, dtype=np.float64)
        high = 65535.0 if image.mode.startswith("I;16") or arr.max() > 255 else 255.0
        if image.mode == "F":
            lo, hi = float(arr.min()), float(arr.max())
            arr = (arr - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(arr)
        else:
            arr = arr / high * 255.0
        image = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), "L")
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, background + (255,))
        image = Image.alpha_composite(canvas, rgba)
    return image.convert("RGB")


def decode(path: str | os.PathLike | Any, how: Decode = Decode(),
           region: Callable[[int, int], Region | None] | None = None) -> tuple[Decoded, Region | None]:
    """Decode `path` as `how` says (module docstring): the `Decoded` RGB image and the `region` the caller planned
    (None without a planner). Raises `ImageLoadError` naming the file and the reason when it is missing, empty,
    undecodable or larger than `how.max_pixels` (checked on the header, before any pixel is decoded), so a corrupt or
    huge file is a recorded failure, never a crash or a memory blow-up."""
    path = as_source(path)
    if not path.is_file():
        raise ImageLoadError(path, "file not found")
    if path.stat().st_size == 0:
        raise ImageLoadError(path, "empty file (0 bytes)")
    try:
        with path.open("rb") as fh, Image.open(fh) as img:
            raw = img.size
            if how.max_pixels is not None and raw[0] * raw[1] > how.max_pixels:
                raise ImageLoadError(path,
                                     f"image too large: {raw[0]}x{raw[1]} = {raw[0] * raw[1] / 1e6:.1f} MP exceeds "
                                           f"the {how.max_pixels / 1e6:g} MP limit (decompression-bomb guard; raise "
                                           f"max_pixels to load it)")
            orientation = orientation_of(img) if how.orient else 1
            full = _stored_size(raw, orientation)
            planned = region(*full) if region is not None else None
            scale = dct_scale(planned) if how.draft and img.format == "JPEG" else 1
            if scale > 1:
                drafted = img.draft(img.mode, (raw[0] // scale, raw[1] // scale))
                scale = round(raw[0] / drafted[1][2]) if drafted else 1
            img.load()
            image: Image.Image = img
            if orientation != 1:
                image = image.transpose(TRANSPOSES[orientation])
            image = to_rgb_mode(image)
            return Decoded(image, full, scale, orientation, raw), planned
    except ImageLoadError:
        raise
    except Exception as err:  # PIL raises many types for corrupt data (and DecompressionBombError past its own limit)
        raise ImageLoadError(path, f"cannot decode image ({type(err).__name__}: {err})") from err
