"""Figure plumbing: one style table, saving without a second draw, rendering in worker processes, and the checks the
tests run on a Figure before it is saved (axes, artists, overlapping tick labels).

Every figure is a matplotlib `Figure` (object API, no pyplot state) with a constrained layout, saved at `DPI` in one
draw (never `bbox_inches="tight"`, which draws twice). `render(jobs)` builds and saves many figures in a process pool.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, Callable, Sequence

from pipelines.io import atomic_path

DPI = 150
"""Resolution of every PNG (and of raster parts of a PDF)."""
FORMATS = ("png", "pdf")
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
          "#7f7f7f", "#393b79", "#e7969c", "#637939", "#fdae6b", "#7b4173", "#9edae5", "#843c39", "#a1d99b",
          "#3182bd", "#636363", "#e6550d", "#31a354", "#756bb1", "#000000")
"""24 distinct colours (tab10, then darker / lighter ones): a figure with up to 24 series repeats none."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
LINESTYLES = ("-", "--", "-.", ":")


@dataclass(frozen=True)
class Style:
    color: str
    marker: str
    linestyle: str

    def kwargs(self) -> dict[str, str]:
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle}


def styles(n: int) -> list[Style]:
    """`n` styles, no two alike: distinct colours (up to `len(COLORS)`), each also with its own marker and line style
    (so that series differ without colour); past the palette, (colour, line style) pairs stay unique."""
    combos = list(product(LINESTYLES, COLORS))
    return [Style(color, MARKERS[i % len(MARKERS)], linestyle) for i, (linestyle, color) in enumerate(combos[:n])] + \
        [Style(COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)], "-") for i in range(len(combos), n)]


def new_figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def grid_figure(nrows: int, ncols: int, panel: tuple[float, float], margins: tuple[float, float, float, float] =
                (0.7, 0.2, 0.55, 0.55), gaps: tuple[float, float] = (0.6, 0.75)) -> tuple[Any, Any]:
    """A figure of `nrows` x `ncols` panels of `panel` (width, height) inches with fixed `margins` (left, right, top,
    bottom) and `gaps` (between columns, rows) in inches: no layout engine, so it is laid out and drawn once, with no
    layout pass. Returns (figure, axes array [nrows, ncols])."""
    left, right, top, bottom = margins
    width = left + right + ncols * panel[0] + (ncols - 1) * gaps[0]
    height = top + bottom + nrows * panel[1] + (nrows - 1) * gaps[1]
    figure = new_figure(width, height)
    figure.set_layout_engine(None)
    grid = figure.subplots(nrows, ncols, squeeze=False)
    figure.subplots_adjust(left=left / width, right=1 - right / width, top=1 - top / height, bottom=bottom / height,
                           wspace=gaps[0] / panel[0], hspace=gaps[1] / panel[1])
    return figure, grid


def fixed_layout(figure: Any) -> Any:
    """Lay `figure` out once and drop its layout engine, so that saving draws it once (matplotlib otherwise runs a
    layout draw before each save)."""
    engine = figure.get_layout_engine()
    if engine is not None:
        engine.execute(figure)
        figure.set_layout_engine(None)
    return figure


def save_figure(figure: Any, path: str | os.PathLike, formats: Sequence[str] = ("png",)) -> Path:
    """`path` (its suffix replaced by each format's), written atomically in one draw per format; returns the PNG (or
    the first format's) path."""
    path = Path(path)
    written = []
    fixed_layout(figure)
    for fmt in formats:
        target = path.with_suffix(f".{fmt}")
        with atomic_path(target) as tmp:
            figure.savefig(tmp, format=fmt, dpi=DPI)
        written.append(target)
    return written[0]


def overlapping_ticks(figure: Any) -> list[tuple[str, str]]:
    """Pairs of visible tick labels of one axis that overlap (their rendered bounding boxes intersect)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    found = []
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            boxes = [t.get_window_extent(renderer) for t in labels]
            for i in range(len(boxes)):
                for j in range(i + 1, len(boxes)):
                    if boxes[i].overlaps(boxes[j]):
                        found.append((labels[i].get_text(), labels[j].get_text()))
    return found


@dataclass(frozen=True)
class Job:
    """One figure to make: `build(**kwargs)` returns the Figure, saved to `path` in each format."""

    build: Callable[..., Any]
    path: Path
    kwargs: dict[str, Any] = field(default_factory=dict)


def _run(job: Job, formats: Sequence[str]) -> Path:
    return save_figure(job.build(**job.kwargs), job.path, formats)


def render(jobs: Sequence[Job], formats: Sequence[str] = ("png",), workers: int | None = None,
           log: Callable[[str], None] = lambda line: None) -> list[Path]:
    """Build and save every job, in a pool of `workers` processes (default: the CPUs, at most one per job); a job that
    fails is logged and skipped. Returns the paths written, in job order."""
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    results: list[Path | None] = []
    if workers <= 1:
        for job in jobs:
            try:
                results.append(_run(job, formats))
            except Exception as err:  # noqa: BLE001 - one failing figure must not lose the rest
                log(f"report: figure {job.path.name} failed: {type(err).__name__}: {err}")
                results.append(None)
        return [p for p in results if p is not None]
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:
        futures = [pool.submit(_run, job, tuple(formats)) for job in jobs]
        for job, future in zip(jobs, futures):
            try:
                results.append(future.result())
            except Exception as err:  # noqa: BLE001
                log(f"report: figure {job.path.name} failed: {type(err).__name__}: {err}")
                results.append(None)
    return [p for p in results if p is not None]


__all__ = ["DPI", "FORMATS", "COLORS", "MARKERS", "LINESTYLES", "Style", "styles", "new_figure", "grid_figure", "fixed_layout", "save_figure",
           "overlapping_ticks", "Job", "render"]
