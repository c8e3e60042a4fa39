"""The contact sheet of a generation job: for each of the first outputs, its target, its material exemplar and the
output side by side, each tile captioned with its short file name, under a header naming the three columns."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont, ImageOps

from pipelines.io import atomic_save_image

CONTACT_SHEET_IMAGES = 16
COLUMNS = ("target", "material", "output")
TILE = 256  # px, each side of a thumbnail
FONT_SIZE = 18
PAD = 8  # px between tiles and around captions
GROUP_GAP = 32  # px between two (target, material, output) groups on one line
BACKGROUND, INK, MISSING, FRAME = (255, 255, 255), (20, 20, 20), (200, 200, 200), (170, 170, 170)


def sheet_font(size: int = FONT_SIZE) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """PIL's bundled default font at `size` px (Pillow >= 10.1 with FreeType), else its small bitmap font."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: no size argument
        return ImageFont.load_default()


def short_name(text: str, font: Any, width: int) -> str:
    """`text` (a file name) shortened in the middle with an ellipsis until it fits in `width` px."""
    if font.getlength(text) <= width:
        return text
    head, tail = text[: len(text) // 2], text[len(text) // 2:]
    while head or tail:
        head, tail = (head[:-1], tail) if len(head) >= len(tail) else (head, tail[1:])
        if font.getlength(f"{head}…{tail}") <= width:
            return f"{head}…{tail}"
    return "…"


def thumbnail(path: str | Path | None, tile: int = TILE) -> Image.Image:
    """The image at `path` scaled (up or down) to fit a `tile` square, aspect kept, centred on white; a grey tile
    saying "unreadable" when it cannot be read (an input removed or broken since the job ran)."""
    canvas = Image.new("RGB", (tile, tile), BACKGROUND)
    try:
        with Image.open(path) as img:
            image = ImageOps.exif_transpose(img).convert("RGB")
    except (OSError, TypeError, ValueError):
        canvas.paste(MISSING, (0, 0, tile, tile))
        font = sheet_font()
        ImageDraw.Draw(canvas).text(((tile - font.getlength("unreadable")) / 2, tile / 2 - FONT_SIZE / 2),
                                    "unreadable", fill=INK, font=font)
        return canvas
    small = ImageOps.contain(image, (tile, tile), Image.LANCZOS if max(image.size) > tile else Image.NEAREST)
    canvas.paste(small, ((tile - small.width) // 2, (tile - small.height) // 2))
    return canvas


def sheet_entries(rows: Sequence[dict[str, Any]], out: Path) -> list[tuple[Path | str | None, ...]]:
    """(target, material, output) paths of manifest rows written by the job (their provenance names the inputs)."""
    entries = []
    for row in rows:
        provenance = row.get("provenance") or {}
        entries.append((provenance.get("source_target"), provenance.get("source_material"), out / row["file_name"]))
    return entries


def contact_sheet(rows: Sequence[dict[str, Any]], out: Path, destination: Path, tile: int = TILE,
                  groups_per_line: int = 2) -> Path | None:
    """Draw `rows` (output manifest rows) as labelled (target, material, output) groups, `groups_per_line` groups to a
    line, and save the sheet atomically as PNG; None when there is nothing to show."""
    entries = sheet_entries(rows, out)
    if not entries:
        return None
    font = sheet_font()
    line_height = round(font.getbbox("Ag")[3]) + PAD
    groups = min(groups_per_line, len(entries))
    group_width = len(COLUMNS) * tile + (len(COLUMNS) - 1) * PAD
    cell_height = tile + line_height + PAD
    lines = (len(entries) + groups - 1) // groups
    width = groups * group_width + (groups - 1) * GROUP_GAP + 2 * PAD
    sheet = Image.new("RGB", (width, PAD + line_height + lines * cell_height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    for group in range(groups):  # the header: what each column is
        for column, label in enumerate(COLUMNS):
            x = PAD + group * (group_width + GROUP_GAP) + column * (tile + PAD)
            draw.text((x + (tile - font.getlength(label)) / 2, PAD // 2), label, fill=INK, font=font)
    for group in range(1, groups):  # a rule between the groups of a line
        x = PAD + group * (group_width + GROUP_GAP) - GROUP_GAP // 2
        draw.line((x, PAD, x, sheet.height - PAD), fill=FRAME, width=2)
    for index, paths in enumerate(entries):
        line, group = divmod(index, groups)
        top = PAD + line_height + line * cell_height
        for column, path in enumerate(paths):
            x = PAD + group * (group_width + GROUP_GAP) + column * (tile + PAD)
            sheet.paste(thumbnail(path, tile), (x, top))
            draw.rectangle((x - 1, top - 1, x + tile, top + tile), outline=FRAME)
            caption = short_name(Path(path).name if path else "?", font, tile)
            draw.text((x + (tile - font.getlength(caption)) / 2, top + tile + PAD // 2), caption, fill=INK, font=font)
    atomic_save_image(destination, sheet)
    return destination
