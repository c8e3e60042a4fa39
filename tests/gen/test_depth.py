"""Depth maps: ZeST's min-max 8-bit normalisation and the batched transformers estimator."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from gen.depth import DepthEstimator, normalise_depth


def test_normalise_depth_matches_zest_16_bit_rounding():
    rng = np.random.default_rng(0)
    depth = rng.normal(3.0, 2.0, (17, 23))
    got = np.asarray(normalise_depth(depth))
    # by hand: min-max to [0, 1], to 16 bits, integer-divide into 8 bits
    expected = np.floor((depth - depth.min()) / (depth.max() - depth.min()) * 65535 / 256).astype(np.uint8)
    np.testing.assert_array_equal(got, expected)
    assert got.min() == 0 and got.max() == 255
    assert not np.asarray(normalise_depth(np.full((4, 4), 7.0))).any()


@pytest.mark.slow
def test_estimator_is_batched_per_image_sized_and_normalised(tiny_zest_config, one_thread):
    estimator = DepthEstimator.from_pretrained(tiny_zest_config.depth, device="cpu", batch_size=2)
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h,
              w in [(40, 56), (64, 64), (30, 20)]]
    maps = estimator(images)
    assert [m.size for m in maps] == [im.size for im in images] and all(m.mode == "L" for m in maps)
    # independent path: one image at a time through the model, bicubic resize, min-max by hand
    for image, depth_map in zip(images, maps):
        pixels = estimator.processor(images=image, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            predicted = estimator.model(pixel_values=pixels).predicted_depth
        resized = F.interpolate(predicted[:, None], size=image.size[::-1], mode="bicubic", align_corners=False)[0, 0]
        d = resized.double().numpy()
        expected = np.floor((d - d.min()) / (d.max() - d.min()) * 65535 / 256).astype(np.int64)
        assert np.abs(np.asarray(depth_map, dtype=np.int64) - expected).max() <= 1
