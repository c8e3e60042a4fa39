"""Figure plumbing: one style table, saving without a second draw, rendering in worker processes, and the checks the
tests run on a Figure before it is saved (axes, artists, overlapping tick labels).

Every figure is a matplotlib `Figure` (object API, no pyplot state) with a constrained layout, saved at `DPI` in one
draw (never `bbox_inches="tight"`, which draws twice). `render(jobs)` builds and saves many figures in a process pool.
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from pipelines.io import atomic_path

DPI = 150
"""Resolution of every PNG (and of raster parts of a PDF)."""
FORMATS = ("png", "pdf")
JPEG_QUALITY = 88
"""Thumbnail sheets (mosaics of photographs) are JPEGs of this quality: a tenth of a PNG's encoding time and size."""
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
          "#7f7f7f", "#393b79", "#e7969c", "#637939", "#fdae6b", "#7b4173", "#9edae5", "#843c39", "#a1d99b",
          "#3182bd", "#636363", "#e6550d", "#31a354", "#756bb1", "#000000")
"""24 distinct colours (tab10, then darker / lighter ones): a figure with up to 24 series repeats none."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
LINESTYLES = ("-", "--", "-.", ":")
PNG_COMPRESSION = 3
"""zlib level of the PNGs (6, PIL's default, takes about 3x as long for files ~15% smaller)."""
PARALLEL_JOBS = 4
"""`render` uses worker processes from this many figures on (below it, starting them costs what they save)."""


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


_CANVAS: dict[str, Any] = {}
"""The process's one figure, reused from job to job while `render` runs (`reuse_canvas`)."""


@contextmanager
def reuse_canvas() -> Iterator[None]:
    """While active, `new_figure` hands out this process's one Figure (cleared and resized) instead of a new one:
    `render` builds and saves one figure at a time."""
    _CANVAS.setdefault("active", 0)
    _CANVAS["active"] += 1
    try:
        yield
    finally:
        _CANVAS["active"] -= 1


def new_figure(width: float, height: float) -> Any:
    """A Figure of `width` x `height` inches at `DPI` with a constrained layout and an Agg canvas (inside
    `reuse_canvas`: the process's one Figure, cleared)."""
    figure = _CANVAS.get("figure") if _CANVAS.get("active") else None
    if figure is None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
        FigureCanvasAgg(figure)
        if _CANVAS.get("active"):
            _CANVAS["figure"] = figure
        return figure
    for axes in list(figure.axes):  # removed, not cleared: clearing rebuilds each axes' ticks
        figure.delaxes(axes)
    figure.clear()
    figure.set_size_inches(width, height)
    figure.set_layout_engine("constrained")
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


def text_inches(labels: Sequence[str], points: float = 10.0) -> float:
    """About the width in inches of the longest of `labels` at `points` (DejaVu Sans: ~0.6 em a character): fixed
    layouts size their margins with it instead of running a layout pass."""
    return max((len(str(t)) for t in labels), default=0) * 0.6 * points / 72


def fixed_layout(figure: Any) -> Any:
    """Lay `figure` out once and drop its layout engine, so that saving draws it once (matplotlib otherwise runs a
    layout draw before each save)."""
    engine = figure.get_layout_engine() if hasattr(figure, "get_layout_engine") else None
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
        options = {"pil_kwargs": {"compress_level": PNG_COMPRESSION}} if fmt == "png" else {}
        with atomic_path(target) as tmp:
            figure.savefig(tmp, format="jpeg" if fmt == "jpg" else fmt, dpi=DPI, **options)
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


def figure_problems(figure: Any, y_range: tuple[float, float] | None = None) -> list[str]:
    """What a reader could not use in `figure`: an axes with nothing drawn, non-finite axis limits, NaN or infinite
    values among its lines' data, y limits outside `y_range` (e.g. a percentage's [-5, 105])."""
    import numpy as np

    problems = []
    for i, axes in enumerate(figure.axes):
        name = axes.get_title() or axes.get_label() or f"axes {i}"
        if not (axes.lines or axes.images or axes.patches or axes.collections):
            problems.append(f"{name}: nothing drawn")
        limits = [*axes.get_xlim(), *axes.get_ylim()]
        if not np.isfinite(limits).all():
            problems.append(f"{name}: axis limits {limits}")
        for line in axes.lines:
            data = np.r_[np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)]
            if data.size and not np.isfinite(data).all():
                problems.append(f"{name}: line {line.get_label()!r} has NaN or infinite values")
        if y_range is not None and axes.get_ylabel() and not (y_range[0] <= min(axes.get_ylim()) and
                                                            max(axes.get_ylim()) <= y_range[1]):
            problems.append(f"{name}: y limits {axes.get_ylim()} outside {y_range}")
    return problems


@dataclass(frozen=True)
class Job:
    """One figure to make: `build(**kwargs)` returns the Figure, saved to `path` in each format."""

    build: Callable[..., Any]
    path: Path
    kwargs: dict[str, Any] = field(default_factory=dict)
    formats: tuple[str, ...] | None = None  # its own formats (a thumbnail sheet: jpg); None: render's


def _run(job: Job, formats: Sequence[str]) -> Path:
    with reuse_canvas():
        return save_figure(job.build(**job.kwargs), job.path, job.formats or formats)


_WORKER_JOBS: list[Job] = []
"""A forked worker's jobs, filled once by its initializer from the `render` call that started it (the arguments of a
forked process are inherited, not pickled: score arrays stay shared); the parent never fills it."""


def _adopt(jobs: Sequence[Job]) -> None:
    _WORKER_JOBS.extend(jobs)


def _run_adopted(i: int, formats: Sequence[str]) -> Path:
    return _run(_WORKER_JOBS[i], formats)


def _serial(jobs: Sequence[Job], formats: Sequence[str], log: Callable[[str], None]) -> list[Path | None]:
    results: list[Path | None] = []
    for job in jobs:
        try:
            results.append(_run(job, formats))
        except Exception as err:  # noqa: BLE001 - one failing figure must not lose the rest
            log(f"report: figure {job.path.name} failed: {type(err).__name__}: {err}")
            results.append(None)
    return results


def free_cpus() -> int:
    """The CPUs not busy now: the CPUs less the 1-minute load average of the other processes (the caller is one of
    the runnable ones), at least 1; workers beyond them only share the same cores."""
    cpus = os.cpu_count() or 1
    try:
        others = max(os.getloadavg()[0] - 1.0, 0.0)
    except (AttributeError, OSError):
        return cpus
    return max(1, min(cpus, int(cpus - others + 0.5)))


def _warm_fonts() -> None:
    """Load matplotlib's font and text caches once in the parent, so that every forked worker inherits them."""
    figure = new_figure(1.0, 0.5)
    figure.text(0.5, 0.5, "0.5 AUROC", fontsize="small")
    figure.canvas.draw()


def render(jobs: Sequence[Job], formats: Sequence[str] = ("png",), workers: int | None = None,
           log: Callable[[str], None] = lambda line: None) -> list[Path]:
    """Build and save every job; a job that fails is logged and skipped. Returns the paths written, in job order.

    In one process when that is as fast: fewer than `PARALLEL_JOBS` jobs, one worker (`workers`, default the free
    CPUs: `free_cpus`) or no `fork` (a spawned worker would re-import everything and receive every job's arrays
    pickled). Else a pool of forked workers that inherit the jobs. Each process reuses one figure canvas from job to
    job."""
    workers = min(workers or free_cpus(), len(jobs))
    if workers <= 1 or len(jobs) < PARALLEL_JOBS or "fork" not in multiprocessing.get_all_start_methods():
        return [p for p in _serial(jobs, formats, log) if p is not None]
    _warm_fonts()
    results: list[Path | None] = []
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_adopt,
                             initargs=(list(jobs),)) as pool:
        futures = [pool.submit(_run_adopted, i, tuple(formats)) for i in range(len(jobs))]
        for job, future in zip(jobs, futures):
            try:
                results.append(future.result())
            except Exception as err:  # noqa: BLE001
                log(f"report: figure {job.path.name} failed: {type(err).__name__}: {err}")
                results.append(None)
    return [p for p in results if p is not None]


__all__ = ["DPI", "FORMATS", "JPEG_QUALITY", "COLORS", "MARKERS", "LINESTYLES", "PNG_COMPRESSION", "PARALLEL_JOBS",
           "Style", "styles", "reuse_canvas", "new_figure", "text_inches", "grid_figure", "fixed_layout", "save_figure",
           "overlapping_ticks", "figure_problems", "Job", "free_cpus", "render"]
