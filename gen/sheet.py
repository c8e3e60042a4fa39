"""The contact sheet of a generation job: thumbnails of the first outputs."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from PIL import Image

from pipelines.io import atomic_save_image

CONTACT_SHEET_IMAGES = 16


def contact_sheet(paths: Sequence[Path], destination: Path, thumb: int = 128, columns: int = 4) -> Path | None:
    """A grid of thumbnails of `paths` saved atomically as PNG; None when there is nothing to show."""
    if not paths:
        return None
    rows = (len(paths) + columns - 1) // columns
    sheet = Image.new("RGB", (min(columns, len(paths)) * thumb, rows * thumb), (255, 255, 255))
    for i, path in enumerate(paths):
        with Image.open(path) as img:
            small = img.convert("RGB")
            small.thumbnail((thumb, thumb))
        sheet.paste(small, ((i % columns) * thumb + (thumb - small.width) // 2, (i // columns) * thumb + (thumb - small.height) // 2))
    atomic_save_image(destination, sheet)
    return destination


