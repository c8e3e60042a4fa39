#!/usr/bin/env python
"""Check a report's index.html in a real headless Chromium: `python scripts/check_report_html.py REPORT/index.html`.

1. Every file the page references (figures, tables) exists beside it, and every PNG decodes.
2. Chromium (the Debian package `chromium`) loads the page: every <img> loaded (complete, natural width > 0) and the
   tables are there; the page's height is measured.
3. The page opens on the result: its main table (`id="main-table"`, the paper's first table) starts on the first
   screen (`--width` x `--first-screen` pixels, default 1400 x 900) and the page is no wider than the window (wide
   tables scroll inside their box); the first screen is captured (REPORT/index_first_screen.png).
4. The whole page is captured for a person to look at: one screenshot (default REPORT/index_screenshot.png) when it
   is at most `--tile` pixels high, else tiles of `--tile` pixels top to bottom (index_screenshot_01.png, ...), each a
   window onto the page shifted by its offset, so that no part is lost; it says how many. When the page's height
   cannot be read it says so and counts that as a problem.

Prints one line per check; exit status 0 when all pass, 1 when one fails, 2 when Chromium or the page is missing.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from detectors.harness.report.html import MAIN_TABLE, missing_files, referenced_files
from pipelines.cli import parser as cli_parser
from pipelines.cli import run_main
from pipelines.errors import UserInputError

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
PROBE = """<!DOCTYPE html><html><body><iframe id="f" src="{src}" style="width:{width}px;height:2000px"></iframe>
<pre id="out">pending</pre><script>
document.getElementById("f").addEventListener("load", () => {{
  const d = document.getElementById("f").contentDocument;
  const imgs = [...d.images];
  const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute("src"));
  const main = d.getElementById("{main}");
  const box = main ? main.getBoundingClientRect() : null;
  const rows = main ? main.querySelectorAll("tbody tr") : [];
  const first = rows.length ? rows[0].getBoundingClientRect() : null;
  document.getElementById("out").textContent = JSON.stringify({{images: imgs.length, broken: broken,
    tables: d.querySelectorAll("table").length, height: d.documentElement.scrollHeight,
    scroll_width: d.documentElement.scrollWidth,
    main: box ? {{top: box.top, bottom: box.bottom, width: box.width, first_row: first ? first.bottom : null,
                  rows: rows.length}} : null}});
}});
</script></body></html>
"""


def find_chromium() -> str | None:
    """The path of a Chromium binary, or None."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def _chromium(binary: str, *args: str, timeout: float = 120) -> str:
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--allow-file-access-from-files"]
    done = subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=timeout)
    return done.stdout


def probe(binary: str, index: Path, width: int = 1400) -> dict:
    """What Chromium saw once the page loaded at `width` pixels: `images`, `broken` (their src), `tables`, `height` and
    `scroll_width` (pixels), `main` (the main table's `top`, `bottom`, `width`, its first row's bottom `first_row`,
    `rows`; None without one)."""
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "probe.html"
        page.write_text(PROBE.format(src=index.resolve().as_uri(), width=width, main=MAIN_TABLE), encoding="utf-8")
        dom = _chromium(binary, "--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    found = re.search(r'<pre id="out">([^<]*)</pre>', dom)
    if not found or found.group(1) == "pending":
        raise RuntimeError(f"Chromium did not load {index} (no probe result)")
    return json.loads(found.group(1).replace("&quot;", '"'))


TILE_PAGE = """<!DOCTYPE html><html><body style="margin:0;overflow:hidden">
<iframe src="{src}" scrolling="no" style="position:absolute;left:0;top:-{offset}px;width:{width}px;height:{height}px;
border:0"></iframe></body></html>
"""


def screenshot(binary: str, index: Path, path: Path, width: int, height: int) -> Path:
    """A screenshot of the page at `width` x `height` pixels."""
    _chromium(binary, "--virtual-time-budget=5000", f"--window-size={width},{height}", f"--screenshot={path.resolve()}",
              index.resolve().as_uri())
    if not path.is_file():
        raise RuntimeError(f"Chromium wrote no screenshot to {path}")
    return path


def tile_offsets(height: int, tile: int) -> list[tuple[int, int]]:
    """(offset, tile height) of the tiles covering a page `height` pixels high, top to bottom."""
    return [(top, min(tile, height - top)) for top in range(0, max(height, 1), tile)]


def screenshots(binary: str, index: Path, path: Path, width: int, height: int, tile: int) -> list[Path]:
    """The whole page: `path` when it fits in one `tile`, else `path`_01.png, ... one per tile."""
    if height <= tile:
        return [screenshot(binary, index, path, width, height)]
    shots = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (offset, size) in enumerate(tile_offsets(height, tile), start=1):
            page = Path(tmp) / f"tile{i}.html"
            page.write_text(TILE_PAGE.format(src=index.resolve().as_uri(), offset=offset, width=width, height=height),
                            encoding="utf-8")
            shots.append(screenshot(binary, page, path.with_name(f"{path.stem}_{i:02d}.png"), width, size))
    return shots


def check_files(index: Path) -> list[str]:
    """Problems with the files the page references: missing, or images (PNG, JPEG) that do not decode."""
    problems = [f"missing: {f}" for f in missing_files(index)]
    for name in referenced_files(index.read_text(encoding="utf-8")):
        path = index.parent / name
        if path.suffix.lower() in (".png", ".jpg", ".jpeg") and path.is_file():
            try:
                with Image.open(path) as image:
                    image.verify()
            except Exception as err:  # noqa: BLE001 - any decoding failure is a broken figure
                problems.append(f"not a readable {path.suffix[1:].upper()}: {name} ({type(err).__name__})")
    return problems


def first_screen_problems(seen: dict, width: int, first_screen: int) -> list[str]:
    """Problems with what a reader sees first: no main table, a main table whose first row is not on the first
    screen, a page wider than the window."""
    problems = []
    main = seen.get("main")
    if main is None:
        problems.append(f"no main table (id={MAIN_TABLE!r}) on the page")
    elif main["first_row"] is None or main["first_row"] > first_screen:
        problems.append(f"the main table starts at {main['top']:.0f} px: its first row is not on the first screen "
                        f"({width} x {first_screen})")
    if seen.get("scroll_width", 0) > width:
        problems.append(f"the page is {seen['scroll_width']} px wide, wider than the {width} px window")
    return problems


def check(index: Path, out: Path | None = None, width: int = 1400, tile: int = 8000,
          first_screen: int = 900) -> list[str]:
    """Run every check; returns the problems found (empty: all good). Writes the first screen's and the whole page's
    screenshots."""
    if not index.is_file():
        raise UserInputError(f"{index}: no such page")
    binary = find_chromium()
    if binary is None:
        raise UserInputError("Chromium not found: install the Debian package `chromium` (apt-get install -y chromium)")
    problems = check_files(index)
    seen = probe(binary, index, width)
    problems += [f"Chromium could not load image: {src}" for src in seen["broken"]]
    print(f"chromium: {seen['images']} image(s), {len(seen['broken'])} broken, {seen['tables']} table(s), "
          f"page height {seen['height']} px, width {seen.get('scroll_width')} px")
    main = seen.get("main")
    if main is not None:
        print(f"main table: top {main['top']:.0f} px, first row ends at {main['first_row'] or 0:.0f} px, "
              f"{main['rows']} row(s), {main['width']:.0f} px wide")
    problems += first_screen_problems(seen, width, first_screen)
    height = int(seen.get("height") or 0)
    if height <= 0:
        problems.append(f"the page's height could not be read: only the first {tile} px were captured")
        height = tile
    shots = screenshots(binary, index, out or index.parent / "index_screenshot.png", width, height, tile)
    print(f"screenshot: the whole page ({height} px) in {len(shots)} tile(s) of at most {tile} px: " +
          ", ".join(str(s) for s in shots))
    first = shots[0].with_name("index_first_screen.png")
    with Image.open(shots[0]) as image:  # the top of the first tile: what a reader sees first
        image.crop((0, 0, width, min(first_screen, image.height))).save(first)
    print(f"first screen: {first}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = cli_parser(__doc__)
    p.add_argument("index", type=Path, help="the report's index.html")
    p.add_argument("--screenshot", type=Path, default=None, help="PNG to write (default: beside index.html)")
    p.add_argument("--width", type=int, default=1400, help="window width in pixels (default 1400)")
    p.add_argument("--tile", type=int, default=8000, help="tallest screenshot in pixels; taller pages are tiled "
                   "(default 8000)")
    p.add_argument("--first-screen", type=int, default=900,
                   help="height in pixels of the first screen that must show the main table (default 900)")
    args = p.parse_args(argv)
    if args.tile < 100:
        raise UserInputError(f"--tile: at least 100 pixels, got {args.tile}")
    problems = check(args.index, args.screenshot, args.width, args.tile, args.first_screen)
    for line in problems:
        print(f"problem: {line}")
    print("ok: every referenced file exists and loads" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(run_main(main, doc="docs/report.md"))
