"""Checks the report tests share: a written figure read back as a PNG or JPEG (decodes, not blank) and a Figure a reader
can use (`figures.figure_problems`, no overlapping tick labels)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from detectors.harness.report import figures


def assert_usable_png(path: Path, min_size: int = 150, kind: str = "PNG") -> np.ndarray:
    """The PNG (or `kind`: JPEG for a thumbnail sheet) at `path` decodes, is at least `min_size` pixels each way and
    is not blank: more than 1% of it is not background and it holds more than a handful of colours. Returns its RGB
    pixels."""
    with Image.open(path) as image:
        assert image.format == kind, (path, image.format)
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape[0] >= min_size and pixels.shape[1] >= min_size, (path, pixels.shape)
    background = pixels[0, 0]
    drawn = (np.abs(pixels.astype(int) - background).sum(axis=2) > 30).mean()
    assert drawn > 0.01, f"{path}: {drawn:.2%} drawn"
    assert len(np.unique(pixels.reshape(-1, 3)[::7], axis=0)) > 8, f"{path}: too few colours"
    return pixels


def assert_usable_figure(figure, n_axes: int | None = None, y_range: tuple[float, float] | None = None) -> None:
    """`figure` has `n_axes` axes, every one with something drawn, finite limits and data, y within `y_range`, and no
    overlapping tick labels."""
    if n_axes is not None:
        assert len(figure.axes) == n_axes, [a.get_title() for a in figure.axes]
    assert figures.figure_problems(figure, y_range) == []
    assert figures.overlapping_ticks(figure) == []
