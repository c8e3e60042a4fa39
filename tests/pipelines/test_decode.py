"""pipelines.decode: full decodes equal what load_image + the transform gave before (no pixel changes, fewer copies),
draft decodes keep every op's full-size geometry under each of the 8 EXIF orientations (within the stated tolerance of
the full decode), the DCT scale keeps twice the output's pixels, a shard member loads like a file."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from pipelines.data import ImageLoadError, load_image
from pipelines.decode import DRAFT_HEADROOM, Decode, Region, dct_scale, decode, to_rgb_mode
from pipelines.training import transforms as T


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """Smooth colour plus sharp edges and noise: JPEG-like content where a misplaced box shows."""
    rng = np.random.default_rng(seed)
    field = Image.fromarray(rng.integers(0, 256, (height // 32 + 2, width // 32 + 2, 3), dtype=np.uint8))
    base = np.asarray(field.resize((width, height), Image.BICUBIC), dtype=np.float32)
    yy, xx = np.mgrid[0:height, 0:width]
    edges = ((((xx // 41) + (yy // 53)) % 2) * 40 - 20)[..., None]
    return Image.fromarray(np.clip(base + edges + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8))


def jpeg_file(path, image: Image.Image, orientation: int = 1, **save):
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    image.save(path, "JPEG", quality=92, exif=exif.tobytes(), **save)
    return path


class Member:
    """What a shard store's `Manifest.path` returns: is_file, stat, open('rb'), name, suffix."""

    def __init__(self, data: bytes, name: str = "m.jpg"):
        self.data, self.name, self.suffix = data, name, ".jpg"

    def is_file(self) -> bool:
        return True

    def stat(self):
        return type("Stat", (), {"st_size": len(self.data), "st_mtime_ns": 0})()

    def open(self, mode: str = "rb"):
        return io.BytesIO(self.data)

    def __str__(self) -> str:
        return self.name


def old_pixels(path, transform: T.Compose, rng=None) -> np.ndarray:
    """What loading did before pipelines.decode: PIL open, exif_transpose, convert, then the ops."""
    with Image.open(path) as img:
        img.load()
        image = ImageOps.exif_transpose(img).convert("RGB")
    return transform(image, rng).numpy()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_full_decode_equals_the_old_path_and_draft_keeps_the_geometry(tmp_path, orientation):
    path = jpeg_file(tmp_path / "a.jpg", photo(801, 603), orientation)
    ops = [T.RandomResizedCrop(40, scale=(0.3, 1.0)), T.HorizontalFlip()]
    for name, transform in (("eval", T.reference_eval(40, 42)), ("crop", T.Compose(ops))):
        exact, drafted = transform.with_decode(Decode(draft=False)), transform.with_decode(Decode(draft=True))
        for seed in range(3):
            want = old_pixels(path, exact, np.random.default_rng(seed))
            assert np.array_equal(exact.load(path, np.random.default_rng(seed)).numpy(), want), (name, seed)
            diff = np.abs(drafted.load(path, np.random.default_rng(seed)).numpy().astype(int) - want.astype(int))
            # a box misplaced through the orientation would be off by tens of levels on average
            assert diff.mean() < 1.5 and diff.max() <= 24, (name, orientation, seed, diff.mean(), diff.max())


def test_draft_decodes_at_the_coarsest_scale_with_twice_the_output(tmp_path):
    assert DRAFT_HEADROOM == 2.0
    assert dct_scale(Region((0, 0, 2000, 1500), (170, 128))) == 4  # 1500 / 8 = 187 < 256 <= 1500 / 4
    assert dct_scale(Region((0, 0, 4000, 3000), (170, 128))) == 8
    assert dct_scale(Region((0, 0, 300, 300), (170, 128))) == 1 and dct_scale(None) == 1
    path = jpeg_file(tmp_path / "b.jpg", photo(1001, 757))
    seen = []
    decoded, region = decode(path, Decode(draft=True), lambda w,
                             h: seen.append((w, h)) or Region((0, 0, w, h), (60, 45)))
    assert seen == [(1001, 757)] and region.out == (60, 45)
    assert decoded.scale == 8 and decoded.image.size == (126, 95) and decoded.full == (1001, 757)  # ceil(1001 / 8)
    assert decoded.box((0, 0, 1001, 757)) == (0, 0, 1001 / 8, 757 / 8)
    png = tmp_path / "c.png"
    photo(400, 300).save(png)
    assert decode(png, Decode(draft=True), lambda w, h: Region((0, 0, w, h), (10, 10)))[0].scale == 1  # JPEG only


def test_orientation_is_applied_or_the_stored_order_kept(tmp_path):
    image = photo(64, 40)
    path = jpeg_file(tmp_path / "o.jpg", image, 6)
    upright, stored = load_image(path), load_image(path, orient=False)
    assert upright.size == (40, 64) and stored.size == (64, 40)
    with Image.open(path) as raw:
        assert np.array_equal(np.asarray(stored), np.asarray(raw.convert("RGB")))  # as the references read it
        assert np.array_equal(np.asarray(upright), np.asarray(ImageOps.exif_transpose(raw).convert("RGB")))


def test_rgb_images_are_not_copied_and_other_modes_convert():
    rgb = Image.new("RGB", (3, 2), (1, 2, 3))
    assert to_rgb_mode(rgb) is rgb
    assert to_rgb_mode(Image.new("LA", (3, 2), (10, 0))).getpixel((0, 0)) == (255, 255, 255)  # transparent: background
    assert to_rgb_mode(Image.new("CMYK", (3, 2), (0, 0, 0, 0))).getpixel((0, 0)) == (255, 255, 255)
    assert to_rgb_mode(Image.new("I;16", (3, 2), 65535)).getpixel((0, 0)) == (255, 255, 255)


def test_a_shard_member_loads_like_its_file_and_bad_bytes_name_it(tmp_path):
    path = jpeg_file(tmp_path / "s.jpg", photo(300, 200), 3)
    member = Member(path.read_bytes())
    transform = T.reference_eval(40, 42, Decode(draft=True))
    assert np.array_equal(transform.load(member).numpy(), transform.load(path).numpy())
    with pytest.raises(ImageLoadError, match="m.jpg: cannot decode image"):
        T.reference_eval(40, 42).load(Member(path.read_bytes()[:400]))
    with pytest.raises(ImageLoadError, match="too large"):
        decode(path, Decode(max_pixels=1000))
    with pytest.raises(ImageLoadError, match="empty file"):
        decode(Member(b""), Decode())
