"""Foreground masks (given, OpenCV fallback) and ZeST's grayscale init image."""
from __future__ import annotations

import warnings

import cv2
import numpy as np
import pytest
from PIL import Image

from gen.masks import MaskError, binarise, foreground_masks, grayscale_init, load_mask, opencv_mask


def _object_on_plain_background(seed: int = 0, size: tuple[int, int] = (240, 180)):
    """A textured ellipse on a slightly noisy plain background, and its true mask."""
    width, height = size
    rng = np.random.default_rng(seed)
    image = np.full((height, width, 3), (205, 200, 190), dtype=np.int64) + rng.integers(-4, 5, (height, width, 3))
    truth = np.zeros((height, width), np.uint8)
    cv2.ellipse(truth, (width // 2, height // 2), (width // 3, height // 3), 20, 0, 360, 1, -1)
    texture = np.stack([np.full((height, width), 120), np.tile(np.linspace(40, 110, width), (height, 1)),
                        rng.integers(20, 70, (height, width))], axis=-1)
    image[truth > 0] = texture[truth > 0]
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)), truth > 0


def test_opencv_mask_recovers_an_object_on_a_plain_background():
    image, truth = _object_on_plain_background()
    mask = np.asarray(opencv_mask(image))
    assert set(np.unique(mask)) <= {0, 255}
    predicted = mask > 0
    iou = (predicted & truth).sum() / (predicted | truth).sum()
    assert iou > 0.8


def test_given_masks_are_thresholded_and_resized():
    soft = np.tile(np.linspace(0, 255, 8).astype(np.uint8), (4, 1))
    mask = load_mask(Image.fromarray(soft), size=(16, 8))
    assert mask.size == (16, 8) and set(np.unique(np.asarray(mask))) == {0, 255}
    np.testing.assert_array_equal(np.asarray(binarise(Image.fromarray(soft)))[0] > 0, soft[0] >= 128)
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[1:3, 1:3, 3] = 255  # alpha defines the foreground of an RGBA cut-out
    np.testing.assert_array_equal(np.asarray(binarise(Image.fromarray(rgba, "RGBA"))) > 0, rgba[..., 3] > 0)
    image, _ = _object_on_plain_background()
    same_aspect = Image.fromarray(np.tile(np.linspace(0, 255, 120).astype(np.uint8), (90, 1)))
    masks = foreground_masks([image, image], [same_aspect, None], method="opencv")
    assert masks[0].size == image.size and masks[1].size == image.size
    with pytest.raises(MaskError, match="does not match the image size 240x180"):
        foreground_masks([image], [Image.fromarray(soft)])
    with pytest.raises(ValueError, match="masks"):
        foreground_masks([image], [None, None])


def test_grayscale_init_is_gray_inside_and_colour_outside():
    rng = np.random.default_rng(3)
    target = Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    inside = np.zeros((20, 30), bool)
    inside[5:15, 8:22] = True
    init = np.asarray(grayscale_init(target, Image.fromarray(np.where(inside, 255, 0).astype(np.uint8))))
    rgb = np.asarray(target, dtype=np.float64)
    luma = np.floor((rgb @ np.array([299, 587, 114]) + 500) / 1000)  # ITU-R 601 as PIL computes it
    np.testing.assert_array_equal(init[~inside], np.asarray(target)[~inside])
    for channel in range(3):
        assert np.abs(init[..., channel][inside] - luma[inside]).max() <= 1
    assert (init[inside][:, 0] == init[inside][:, 1]).all() and (init[inside][:, 1] == init[inside][:, 2]).all()


def test_given_masks_read_alpha_palette_transparency_and_16_bit(tmp_path):
    inside = np.zeros((6, 8), bool)
    inside[1:5, 2:6] = True
    # an RGBA cut-out of a black object: composited on white it would invert; read by alpha it is the object
    rgba = np.zeros((6, 8, 4), np.uint8)
    rgba[..., 3] = np.where(inside, 255, 0)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "cutout.png")
    np.testing.assert_array_equal(np.asarray(load_mask(tmp_path / "cutout.png")) > 0, inside)
    palette = Image.fromarray(np.where(inside, 1, 0).astype(np.uint8), "P")
    palette.putpalette([255, 255, 255, 0, 0, 0] + [0] * 762)  # background white, object black
    palette.save(tmp_path / "palette.png", transparency=0)
    np.testing.assert_array_equal(np.asarray(load_mask(tmp_path / "palette.png")) > 0, inside)
    sixteen = np.where(inside, 40000, 20000).astype(np.uint16)  # 16-bit values thresholded at half range, not clipped
    Image.fromarray(sixteen).save(tmp_path / "mask16.png")
    np.testing.assert_array_equal(np.asarray(load_mask(tmp_path / "mask16.png")) > 0, inside)
    resized = load_mask(tmp_path / "cutout.png", size=(16, 12))
    np.testing.assert_array_equal(np.asarray(resized)[::2, ::2] > 0, inside)


def test_mask_files_that_cannot_be_used_raise_naming_the_file(tmp_path):
    from pipelines.data import ImageLoadError

    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ImageLoadError, match="bad.png: cannot decode mask"):
        load_mask(tmp_path / "bad.png")
    with pytest.raises(ImageLoadError, match="mask file not found"):
        load_mask(tmp_path / "absent.png")
    Image.new("L", (10, 20), 255).save(tmp_path / "tall.png")
    with pytest.raises(MaskError, match="tall.png: mask size 10x20 does not match the image size 20x10") as err:
        load_mask(tmp_path / "tall.png", size=(20, 10))
    assert err.value.path == str(tmp_path / "tall.png")


@pytest.mark.parametrize("side", [1, 2, 7])
def test_images_too_small_for_the_opencv_mask_raise_a_clear_error(side):
    with pytest.raises(MaskError, match=f"image too small for an automatic mask: {side}x{side}"):
        opencv_mask(Image.new("RGB", (side, side)))
    assert opencv_mask(Image.new("RGB", (8, 8))).size == (8, 8)  # the smallest accepted size runs


def test_rembg_runs_one_session_per_process_and_auto_falls_back_with_a_warning(monkeypatch, caplog):
    import sys
    import types

    import gen.masks as masks

    sessions = []

    def new_session(model):
        sessions.append(model)
        return f"session:{model}"

    def remove(image, session=None):
        assert session == "session:u2net"
        alpha = np.zeros((image.height, image.width), np.uint8)
        alpha[1:3, 1:3] = 200
        return Image.fromarray(np.dstack([np.asarray(image), alpha]), "RGBA")

    monkeypatch.setitem(sys.modules, "rembg", types.SimpleNamespace(new_session=new_session, remove=remove))
    monkeypatch.setattr(masks, "rembg_available", lambda: True)
    masks.rembg_session.cache_clear()
    try:
        image = Image.new("RGB", (4, 4), (9, 9, 9))
        for _ in range(3):
            mask = masks.foreground_mask(image, "auto")
        assert sessions == ["u2net"]  # created once, reused for every image
        assert np.asarray(mask).tolist() == [[0, 0, 0, 0], [0, 255, 255, 0], [0, 255, 255, 0], [0, 0, 0, 0]]
        assert masks.resolve_mask_method("auto") == "rembg"
    finally:
        masks.rembg_session.cache_clear()
    monkeypatch.setattr(masks, "rembg_available", lambda: False)
    masks._warn_fallback.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one log line, never a Python warning with its source line
        for _ in range(3):
            assert masks.resolve_mask_method("auto") == "opencv"
    said = [r for r in caplog.records if "rembg is not installed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING" and "\n" not in said[0].getMessage()
    assert masks.resolve_mask_method("opencv") == "opencv"
    with pytest.raises(ImportError, match="pip install 'oodforge\\[masks\\]'"):
        masks.resolve_mask_method("rembg")
    with pytest.raises(ValueError, match="mask method must be one of"):
        masks.resolve_mask_method("grabcut")


def _black_and_white(size: tuple[int, int] = (20, 10)) -> np.ndarray:
    """uint8 [H, W]: white in the left half's middle rows, black elsewhere."""
    width, height = size
    values = np.zeros((height, width), np.uint8)
    values[3:7, 2:width // 2] = 255
    return values


@pytest.mark.parametrize("mode, alpha", [("RGBA", 255), ("RGBA", 0), ("LA", 255)])
def test_a_mask_with_a_constant_alpha_is_read_by_luminance_with_a_warning(tmp_path, mode, alpha):
    from gen.masks import MaskWarning

    values = _black_and_white()
    colour = np.dstack([values] * 3) if mode == "RGBA" else values[..., None]
    path = tmp_path / "mask.png"
    Image.fromarray(np.dstack([colour, np.full_like(values, alpha)]), mode).save(path)
    with pytest.warns(MaskWarning, match=f"mask.png: its alpha channel is constant \\({alpha}\\)") as caught:
        mask = load_mask(path)
    assert caught[0].message.kind == "constant_alpha"
    np.testing.assert_array_equal(np.asarray(mask) > 0, values > 0)  # not the whole (or no) image


def test_a_varying_alpha_is_still_the_mask_without_a_warning(recwarn):
    values = _black_and_white()
    rgba = np.dstack([np.full((*values.shape, 3), 255, np.uint8), values])  # white everywhere, alpha = the object
    mask = load_mask(Image.fromarray(rgba, "RGBA"))
    np.testing.assert_array_equal(np.asarray(mask) > 0, values > 0)
    assert not recwarn.list


@pytest.mark.parametrize("share, kind", [(1.0, "coverage_full"), (0.995, "coverage_full"), (0.01, "coverage_tiny"),
                                         (0.002, "coverage_tiny"), (0.5, None), (0.02, None), (0.98, None),
                                         (0.0, None)])
def test_coverage_at_or_above_99_or_at_or_below_1_percent_is_warned_about(share, kind, recwarn):
    from gen.masks import MaskWarning, check_coverage

    values = np.zeros(1000, np.uint8)
    values[:round(share * 1000)] = 255
    assert check_coverage(Image.fromarray(values.reshape(20, 50), "L"), "m.png") == pytest.approx(share)
    warned = [w.message for w in recwarn.list if isinstance(w.message, MaskWarning)]
    assert [w.kind for w in warned] == ([kind] if kind else [])
    if kind:
        assert f"m.png: the mask covers {share:.1%} of the image" in str(warned[0])


def test_an_unloadable_rembg_model_is_one_mask_model_error(monkeypatch):
    import sys
    import types

    import gen.masks as masks

    attempts = []

    def new_session(model):
        attempts.append(model)
        raise ConnectionError("cannot reach github.com")

    monkeypatch.setitem(sys.modules, "rembg", types.SimpleNamespace(new_session=new_session))
    monkeypatch.setattr(masks, "rembg_available", lambda: True)
    masks.rembg_session.cache_clear()
    with pytest.raises(masks.MaskModelError, match=r"rembg cannot load its 'u2net' model \(ConnectionError: cannot "
                                                   r"reach github.com\).*mask_method=opencv") as raised:
        masks.open_rembg()
    assert "\n" not in str(raised.value) and attempts == ["u2net"]
    monkeypatch.setattr(masks, "rembg_available", lambda: False)
    with pytest.raises(masks.MaskModelError, match="pip install"):
        masks.open_rembg()
