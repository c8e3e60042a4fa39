"""Resize on fetch against an independent computation (a full decode, PIL's BOX resize, exif_transpose): sizes as
img2dataset's keep_ratio gives them, never an upscale, draft-mode pixels within a stated tolerance of the full
decode, EXIF orientation applied, alpha on white, the format the file name says, the pixel cap before decode."""
from __future__ import annotations

import io

import numpy as np
import pytest
from helpers.http_server import jpeg, png, png_header
from PIL import Image, ImageOps

from pipelines.curation.fetch_client import FetchFailure
from pipelines.curation.fetch_resize import prepare, target_size

CAP = 40_000_000


def decoded(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.float64)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255.0**2 / np.mean((a - b) ** 2)))


def test_sizes_follow_keep_ratio_on_the_shorter_side():
    assert target_size(1200, 900, 512) == (683, 512)  # round(1200 * 512 / 900) = round(682.67)
    assert target_size(900, 1200, 512) == (512, 683)
    assert target_size(4000, 1000, 512) == (2048, 512)  # the shorter side, not the longer
    assert target_size(513, 10000, 512) == (512, 9981)


def test_an_image_at_or_under_the_size_is_kept_byte_for_byte():
    for data in (png(1), jpeg(2, 683, 512)):
        out = prepare(data, "images/x.jpg", 512, CAP)
        assert out.data == data and (out.width, out.height) == (out.original_width, out.original_height)
    big = jpeg(3, 1200, 900)
    assert prepare(big, "images/x.jpg", None, CAP).data == big  # short_side None keeps originals


def test_draft_decode_and_area_resize_match_a_full_decode_within_tolerance():
    """2400 x 1800 to 683 x 512 decodes at 1/2 scale (DCT): against the full decode + the same BOX resize the
    result is within 40 dB PSNR (stated tolerance; JPEG q95 re-encoding included)."""
    data = jpeg(4, 2400, 1800)
    out = prepare(data, "images/x.jpg", 512, CAP)
    assert (out.width, out.height, out.original_width, out.original_height) == (683, 512, 2400, 1800)
    assert out.original_bytes == len(data) and out.record()["bytes"] == len(out.data)
    with Image.open(io.BytesIO(data)) as full:
        reference = np.asarray(full.convert("RGB").resize((683, 512), Image.Resampling.BOX), dtype=np.float64)
    assert Image.open(io.BytesIO(out.data)).format == "JPEG"
    assert psnr(decoded(out.data), reference) > 40


def test_exif_orientation_is_applied_and_the_sizes_recorded_upright():
    data = jpeg(5, 1200, 900, orientation=6)
    out = prepare(data, "images/x.jpg", 512, CAP)
    assert (out.width, out.height, out.original_width, out.original_height) == (512, 683, 900, 1200)
    with Image.open(io.BytesIO(data)) as full:
        upright = ImageOps.exif_transpose(full.convert("RGB"))
        reference = np.asarray(upright.resize((512, 683), Image.Resampling.BOX), dtype=np.float64)
    assert psnr(decoded(out.data), reference) > 40
    small = prepare(jpeg(6, 600, 400, orientation=6), "images/y.jpg", 512, CAP)  # kept as is: sizes still upright
    assert (small.width, small.height, small.original_width, small.original_height) == (400, 600, 400, 600)


def test_alpha_is_composited_on_white_and_the_format_follows_the_file_name():
    out = prepare(png(7, (800, 600), "RGBA"), "images/x.png", 512, CAP)
    with Image.open(io.BytesIO(out.data)) as image:
        assert image.format == "PNG" and image.mode == "RGB" and image.size == (683, 512)
        pixels = np.asarray(image)
    assert (pixels[:, :300] == 255).all()  # the transparent left half is white
    for name, fmt in (("a.webp", "WEBP"), ("a.gif", "JPEG"), ("a.tif", "JPEG"), ("noext", "JPEG")):
        with Image.open(io.BytesIO(prepare(jpeg(8, 1200, 900), name, 512, CAP).data)) as image:
            assert image.format == fmt, name
    cmyk = io.BytesIO()
    Image.new("CMYK", (1200, 900), (0, 128, 255, 0)).save(cmyk, format="JPEG")
    with Image.open(io.BytesIO(prepare(cmyk.getvalue(), "c.jpg", 512, CAP).data)) as image:
        assert image.mode == "RGB" and image.size == (683, 512)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_the_pixel_cap_is_read_from_the_header_before_any_decode():
    header = png_header(10000, 10000, pad=16)  # a header only: decoding it would fail otherwise
    with pytest.raises(FetchFailure, match=r"too many pixels \(10000x10000 > max_pixels=40000000\)") as err:
        prepare(header, "images/x.png", 512, CAP)
    assert err.value.final
    with pytest.raises(FetchFailure, match="too many pixels"):
        prepare(jpeg(9, 1200, 900), "images/x.jpg", 512, 1_000_000)
    with pytest.raises(FetchFailure, match=r"not an image \(OSError\)"):
        prepare(jpeg(9, 1200, 900)[:-2000], "images/x.jpg", 512, CAP)  # truncated: named, final
    with pytest.raises(FetchFailure, match=r"not an image \(OSError\)"):
        prepare(jpeg(9, 683, 512)[:-2000], "images/x.jpg", 512, CAP)  # also when it would be kept as is


def test_the_reference_resize_is_open_insects_download_py():
    """`resize: reference` = Open-Insect's download.py: RGB without EXIF transpose, torchvision Resize(224) (the
    shorter side up or down, the longer one truncated; `pipelines.training.transforms.Resize`, itself checked against
    torchvision 0.14), saved in the file name's format at PIL's defaults (JPEG quality 75)."""
    from pipelines.training.transforms import Resize

    for width, height, orientation in ((1200, 901, 6), (150, 200, 1)):  # a large one rotated by EXIF; a small one
        data = jpeg(7, width, height, orientation=orientation)
        out = prepare(data, "images/x.jpg", 224, CAP, 75, "reference")
        with Image.open(io.BytesIO(data)) as full:
            want = Resize(224)(full.convert("RGB"))
        buffer = io.BytesIO()
        want.save(buffer, format="JPEG")  # PIL's default quality, as `image.save(fpath)`
        assert out.data == buffer.getvalue()
        assert (out.width, out.height) == want.size and (out.original_width, out.original_height) == (width, height)
    assert want.size == (224, 298)  # 150 x 200 upscaled: int(224 * 200 / 150)
