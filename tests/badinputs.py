"""The bad-input matrix as files: every awkward image, mask and manifest line a long job must survive.

Reusable by any test (pytest puts `tests/` on sys.path, so `from badinputs import bad_images`):

    cases = bad_images(tmp_path / "images")          # {name: BadInput}
    for case in cases.values():
        if case.loads: assert load_image(case.path).size == case.size
        else: with pytest.raises(ImageLoadError, match=case.reason): load_image(case.path)

    masks = bad_masks(tmp_path / "masks", {"a": (40, 30), ...})   # masks for targets named a.png, ...
    lines = bad_manifest(tmp_path / "manifest", cases)            # a metadata.jsonl over the images above

Images that load hold a dark textured disc on a light plain background (so automatic masks find an object) at
`OBJECT_SIZE`; `BadInput.generates` says whether the generation job should produce an output from it as a target.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

OBJECT_SIZE = (40, 30)  # (width, height) of the loadable images
HUGE_SIZE = (10_000, 5_000)  # 50 MP: over pipelines.data.MAX_PIXELS


@dataclass(frozen=True)
class BadInput:
    """One case: its file, whether `pipelines.data.load_image` loads it (then at `size` = (width, height)), else a
    regex fragment of the failure reason; `generates`: whether the generation job makes an image from it."""

    name: str
    path: Path
    loads: bool
    reason: str | None = None
    size: tuple[int, int] | None = None
    generates: bool = False


def object_array(size: tuple[int, int] = OBJECT_SIZE, seed: int = 0) -> np.ndarray:
    """uint8 [H, W, 3]: a dark textured ellipse on a light, slightly noisy background."""
    width, height = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    inside = ((x - width / 2) / (width / 3)) ** 2 + ((y - height / 2) / (height / 3)) ** 2 < 1
    texture = rng.integers(20, 90, (height, width, 3))
    background = 220 + rng.integers(-3, 4, (height, width, 3))
    return np.where(inside[..., None], texture, background).astype(np.uint8)


def object_mask(size: tuple[int, int] = OBJECT_SIZE) -> np.ndarray:
    """bool [H, W]: the ellipse of `object_array`."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    return ((x - width / 2) / (width / 3)) ** 2 + ((y - height / 2) / (height / 3)) ** 2 < 1


def _png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def bad_images(folder: str | Path) -> dict[str, BadInput]:
    """Write the image cases into `folder` (the `missing` case's file is not written) and describe them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rgb = Image.fromarray(object_array())
    cases: list[BadInput] = []

    def add(name: str, data: bytes | None, **expect) -> None:
        path = folder / name
        if data is not None:
            path.write_bytes(data)
        cases.append(BadInput(name=path.stem, path=path, **expect))

    add("truncated.png", _png_bytes(rgb)[:200], loads=False, reason="cannot decode")
    add("not_an_image.png", b"this is a text file, not a PNG\n" * 4, loads=False, reason="cannot decode")
    add("zero_bytes.jpg", b"", loads=False, reason="empty file")
    add("missing.png", None, loads=False, reason="file not found")
    add("one_by_one.png", _png_bytes(Image.new("RGB", (1, 1), (10, 20, 30))), loads=True, size=(1, 1))
    add("two_by_two.png", _png_bytes(Image.new("RGB", (2, 2), (10, 20, 30))), loads=True, size=(2, 2))
    gray16 = (object_array()[..., 0].astype(np.uint16) * 257)  # full 16-bit range
    add("gray16.png", _png_bytes(Image.fromarray(gray16)), loads=True, size=OBJECT_SIZE, generates=True)
    cmyk = io.BytesIO()
    rgb.convert("CMYK").save(cmyk, format="JPEG", quality=95)
    add("cmyk.jpg", cmyk.getvalue(), loads=True, size=OBJECT_SIZE, generates=True)
    palette = rgb.quantize(16)
    palette_array = np.asarray(palette).copy()
    background_index = int(palette_array[0, 0])
    add("palette_transparency.png", _png_bytes_with(palette, transparency=background_index), loads=True,
        size=OBJECT_SIZE, generates=True)
    rotated = io.BytesIO()
    exif = rgb.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to display": loads as height x width
    rgb.save(rotated, format="JPEG", exif=exif.tobytes(), quality=95)
    add("exif_rotated.jpg", rotated.getvalue(), loads=True, size=OBJECT_SIZE[::-1], generates=True)
    add("huge.png", _png_bytes(Image.new("1", HUGE_SIZE, 0)), loads=False, reason="too large")
    add("good.png", _png_bytes(rgb), loads=True, size=OBJECT_SIZE, generates=True)
    return {case.name: case for case in cases}


def _png_bytes_with(image: Image.Image, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **params)
    return buffer.getvalue()


def bad_masks(folder: str | Path, targets: dict[str, tuple[int, int]]) -> dict[str, BadInput]:
    """Masks in `folder` for targets named `<stem>.*` of the given sizes, one case per target in order:
    `rgba_cutout` (an RGBA cut-out of a dark object: transparent background, so read by alpha), `wrong_size` (another
    aspect ratio), `empty` (no foreground), `half_size` (same aspect, resized: fine), `missing` (no file). Needs at
    least five targets; `loads` here means the target generates."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kinds = ["rgba_cutout", "wrong_size", "empty", "half_size", "missing"]
    if len(targets) < len(kinds):
        raise ValueError(f"bad_masks needs {len(kinds)} targets, got {len(targets)}")
    cases = {}
    for kind, (stem, size) in zip(kinds, targets.items()):
        path = folder / f"{stem}.png"
        inside = object_mask(size)
        if kind == "rgba_cutout":
            rgba = np.zeros((size[1], size[0], 4), np.uint8)  # black object: composited on white it would invert
            rgba[..., 3] = np.where(inside, 255, 0)
            Image.fromarray(rgba, "RGBA").save(path)
            cases[kind] = BadInput(kind, path, loads=True, size=size, generates=True)
        elif kind == "wrong_size":
            Image.fromarray(np.where(object_mask((size[0], size[0] * 2)), 255, 0).astype(np.uint8)).save(path)
            cases[kind] = BadInput(kind, path, loads=False, reason="does not match the image size")
        elif kind == "empty":
            Image.new("L", size, 0).save(path)
            cases[kind] = BadInput(kind, path, loads=False, reason="empty foreground mask")
        elif kind == "half_size":
            half = (size[0] // 2, size[1] // 2)
            Image.fromarray(np.where(object_mask(half), 255, 0).astype(np.uint8)).save(path)
            cases[kind] = BadInput(kind, path, loads=True, size=size, generates=True)
        else:
            cases[kind] = BadInput(kind, path, loads=False, reason="no mask named")
    return cases


def bad_manifest(folder: str | Path, images: dict[str, BadInput], **row) -> dict[str, object]:
    """A manifest over `images` (file names relative to `folder`, which must hold them) plus two bad lines: one with
    a bad field (`split: "dev"`) and one repeating the first file name. Rows use `row` (default: ID, test, label 0).
    Returns {"file": metadata.jsonl, "rows": valid row count, "bad_lines": {line number: field}}."""
    folder = Path(folder)
    fields = {"split": "test", "role": "id", "ood_set": None, "group": None, "label": 0, **row}
    names = [case.path.relative_to(folder).as_posix() for case in images.values()]
    lines = [json.dumps({"file_name": name, **fields}) for name in names]
    lines.insert(1, json.dumps({"file_name": "bad_field.png", **fields, "split": "dev"}))
    lines.append(json.dumps({"file_name": names[0], **fields}))
    meta = folder / "metadata.jsonl"
    meta.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"file": meta, "rows": len(names), "bad_lines": {2: "split", len(lines): "file_name"}}
