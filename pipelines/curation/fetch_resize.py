"""Check and resize a downloaded image before it is written: the reference's resize (`reference`, the default) or
img2dataset's (`keep_ratio`), or none.

`reference` is what Open-Insect's `download.py:10-31` did to every image its `download.sh` fetched (`--resize_size
224`): PIL open, `convert("RGB")` (EXIF orientation NOT applied), torchvision `Resize(224)` (the shorter side to 224
whether larger or smaller, the longer one truncated, `int(224 * long / short)`; PIL bilinear on the full decode), then
`Image.save(path)`: the file name's format at PIL's defaults (JPEG quality 75). Its pixels are the reference
dataset's, so the protocol's Resize(128) + CenterCrop(126) then reads the images the paper's models read.

`keep_ratio` (img2dataset's, `resizer.py`):
- The header is read first: more than `max_pixels` pixels is refused before any pixel is decoded (PIL's own bomb
  limit is `Image.MAX_IMAGE_PIXELS`, 89.5 MP; the default cap here is well under it).
- An image whose shorter side is at most `short_side` (or any image when `short_side` is None) is kept byte for byte,
  after a full (JPEG: DCT-scaled, so cheap) decode proves it is whole.
- A larger one is decoded with JPEG draft mode (DCT scaling to the smallest 1/2, 1/4 or 1/8 scale still at or above
  the target), its alpha composited on white, scaled so that the shorter side is `short_side` (the other
  `round(side * scale)`, as albumentations' SmallestMaxSize in img2dataset's resizer) with area averaging (PIL's BOX
  filter, img2dataset's `downscale_interpolation="area"`), turned upright by its EXIF orientation, and encoded in
  the format its file name says: JPEG at `quality` (img2dataset: 95) for `.jpg`/`.jpeg` and any suffix that cannot
  hold a resized photo well (`.gif`, `.bmp`, `.tif`), PNG for `.png`, WebP at `quality` for `.webp`. The ICC profile
  is kept, EXIF dropped (its orientation is applied).
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import PurePosixPath

from pipelines.curation.fetch_client import FetchFailure

ENCODERS = {".png": "PNG", ".webp": "WEBP"}  # any other suffix is encoded as JPEG
RESIZE_MODES = ("reference", "keep_ratio", "none")
MODE_DEFAULTS = {"reference": {"short_side": 224, "quality": 75},  # download.sh: --resize_size 224; PIL's save default
                 "keep_ratio": {"short_side": 512, "quality": 95}}  # img2dataset's encode_quality
"""The shorter side and encoder quality each resize mode uses when `short_side` / `quality` are not given."""
MAX_PIXELS = 40_000_000
"""Images with more pixels are refused from their header (well under PIL's 89.5 MP bomb limit)."""
TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height
UPRIGHT = {2: 0, 3: 3, 4: 1, 5: 5, 6: 4, 7: 6, 8: 2}  # orientation -> PIL Image.Transpose value
                                                      # (ImageOps.exif_transpose's)


IMAGE_COLUMNS = ("sha256", "width", "height", "bytes", "original_width", "original_height", "original_bytes")
"""What `Prepared.record` holds of each fetched image (images.csv's columns after the input's)."""


@dataclass
class Prepared:
    """What is written (`data`) and the sizes recorded: the stored image's and the original's (upright)."""

    data: bytes
    width: int
    height: int
    original_width: int
    original_height: int
    original_bytes: int

    def record(self) -> dict:
        return {"sha256": hashlib.sha256(self.data).hexdigest(), "width": self.width, "height": self.height,
                "bytes": len(self.data), "original_width": self.original_width,
                "original_height": self.original_height, "original_bytes": self.original_bytes}


def mode_settings(mode: str, short_side: int | None = None, quality: int | None = None) -> dict:
    """The resolved settings of a resize mode (`short_side` / `quality` None: the mode's `MODE_DEFAULTS`; `none`
    has neither): the one place fetch (`FetchConfig`) and pack (`pipelines.shards.PackConfig`) read them."""
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize mode {mode!r} is not one of {RESIZE_MODES}")
    if mode == "none":
        return {"resize": mode, "short_side": None, "quality": None}
    defaults = MODE_DEFAULTS[mode]
    return ({"resize": mode, "short_side": short_side or defaults["short_side"],
             "quality": quality or defaults["quality"]})


def encoded_suffix(file_name: str) -> str:
    """The suffix of what `prepare` encodes a resized image as: `.png`, `.webp`, else `.jpg` (`ENCODERS`)."""
    suffix = PurePosixPath(str(file_name)).suffix.lower()
    return suffix if suffix in ENCODERS else ".jpg"


def target_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """The size with the shorter side `short_side` and the ratio kept (each side `round(side * scale)`)."""
    scale = short_side / min(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def prepare(data: bytes, file_name: str, short_side: int | None, max_pixels: int, quality: int = 95,
            mode: str = "keep_ratio") -> Prepared:
    """The bytes to store for a download and its sizes; FetchFailure (final) when it is not a whole image or has
    more than `max_pixels` pixels. `mode` is one of `RESIZE_MODES` (`none`, or `short_side` None: the originals)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise FetchFailure(f"too many pixels ({width}x{height} > max_pixels={max_pixels})", True)
            if mode == "reference" and short_side:
                return _reference(image, data, file_name, short_side, quality)
            orientation = image.getexif().get(0x0112) if hasattr(image, "getexif") else None
            upright = (height, width) if orientation in TRANSPOSED else (width, height)
            if not short_side or min(width, height) <= short_side:
                if image.format == "JPEG":
                    image.draft(None, (max(1, width // 8), max(1, height // 8)))
                image.load()
                return Prepared(data, *upright, *upright, len(data))
            size = target_size(width, height, short_side)
            if image.format == "JPEG":
                image.draft(None, size)
            image.load()
            icc = image.info.get("icc_profile")
            small = _flatten(image).resize(size, Image.Resampling.BOX)
            if orientation in UPRIGHT:
                small = small.transpose(UPRIGHT[orientation])
    except FetchFailure:
        raise
    except Image.DecompressionBombError:
        raise FetchFailure(f"too many pixels (over PIL's limit; max_pixels={max_pixels})", True) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as err:
        raise FetchFailure(f"not an image ({type(err).__name__})", True) from None
    return Prepared(_encode(small, file_name, quality, icc), *small.size, *upright, len(data))


def _reference(image, data: bytes, file_name: str, short_side: int, quality: int) -> Prepared:
    """Open-Insect's `resize_image`: the full decode in RGB (no EXIF transpose), torchvision's Resize(short_side)
    (`pipelines.training.transforms.Resize`, checked against torchvision 0.14), saved in the file name's format."""
    from pipelines.training.transforms import Resize

    image.load()
    small = Resize(short_side)(image.convert("RGB"))
    return Prepared(_encode(small, file_name, quality, None), *small.size, *image.size, len(data))


def _flatten(image):
    """RGB (or L for grayscale), with any transparency composited on white (img2dataset's alpha matting)."""
    from PIL import Image

    if image.mode in ("L", "RGB"):
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGB", rgba.size, (255, 255, 255))
        white.paste(rgba, mask=rgba.getchannel("A"))
        return white
    return image.convert("L" if image.mode in ("1", "I;16", "I", "F") else "RGB")


def _encode(image, file_name: str, quality: int, icc: bytes | None) -> bytes:
    fmt = ENCODERS.get(encoded_suffix(file_name), "JPEG")
    options = {"quality": quality} if fmt in ("JPEG", "WEBP") else {}
    if icc:
        options["icc_profile"] = icc
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()
