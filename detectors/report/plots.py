"""The report's figures, each a `*_figure(...)` that returns a matplotlib Figure (saved by `figures.save_figure`, or
made in worker processes by `figures.render`): AUROC / FPR@95 heatmaps, ROC curves per set, score densities per
method, FPR@95 by method grouped by family (ShiftedBronzes Figure 5), the two best methods' densities (Figure 6),
few-shot curves (Figure 7), AUROC distributions per OOD type and region (Open-Insects Figure 1) and thumbnail sheets
(the most ID-looking OOD images; a field set's novel species flagged or missed, Open-Insects Figure 3).

Builders take plain arrays and frames (cheap to send to a worker) and draw every series with its own colour, marker
and line style (`figures.styles`). Histograms and densities are computed with numpy (one `np.histogram` per series, a
binned Gaussian KDE), thumbnails are decoded once at reduced size (PIL `draft` + `thumbnail`) into one mosaic image.
"""
from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from detectors.report.figures import COLORS, DPI, Style, grid_figure, new_figure, styles
from detectors.report.names import family_label, method_label
from detectors.report.tables import ALL, LOW_AUROC, Layout
from detectors.tables import COLUMN_LABELS
from pipelines.io import safe_name

ROBUST = (0.5, 99.5)
"""Percentiles of a method's pooled scores that bound its density plots' x axis (heavy tails, e.g. GRAM, would
otherwise squeeze every histogram into one bin)."""
ROC_POINTS = 1500
"""At most this many points per ROC curve (evenly spaced along the curve's distinct thresholds, ends kept)."""
GROUP_STYLES = {ALL: Style("black", "o", "-"), "hard": Style(COLORS[1], "^", "--"), "easy": Style(COLORS[0], "s", ":")}
"""Figure 5's series: all / hard / easy differ by marker and line style as well as colour."""


def _group_style(name: str, i: int) -> Style:
    """The style of group `name` ('hard OOD' is 'hard'); other groups take the palette's i-th style after them."""
    return GROUP_STYLES.get(name.removesuffix(" OOD")) or styles(i + 4)[i + 3]


# -- heatmap ----------------------------------------------------------------------------------------------------------
def _separators(axes: Any, layout: Layout) -> None:
    """Lines between families (rows) and groups (columns), family names at the right, group names on top."""
    row = 0
    for family, methods in layout.families.items():
        axes.text(1.01, row + (len(methods) - 1) / 2, family_label(family), transform=axes.get_yaxis_transform(),
                  va="center", fontsize="small", fontweight="bold")
        row += len(methods)
        if row < len(layout.methods):
            axes.axhline(row - 0.5, color="black", linewidth=1.5)
    col, centers = 0, []
    for group, sets in layout.groups.items():
        centers.append((col + (len(sets) - 1) / 2, group))
        col += len(sets)
        if col < len(layout.sets):
            axes.axvline(col - 0.5, color="black", linewidth=1.5)
    top = axes.secondary_xaxis("top")
    top.set_xticks([c for c, _ in centers], [g for _, g in centers], fontweight="bold")
    top.tick_params(length=0)


def heatmap_figure(table: pd.DataFrame, layout: Layout, metric: str) -> Any:
    """Methods (grouped by family) x OOD sets (grouped by group) coloured by `metric` ('auroc' or 'fpr95', percent),
    each cell annotated; AUROC below 50 is marked with a dagger. `table` is `per_set_table(averages=False)`."""
    values = np.array([[table.loc[(f, m), (s, metric)] for s in layout.sets] for f, m in layout.rows], dtype=np.float64)
    figure = new_figure(3.2 + 0.8 * len(layout.sets), 1.6 + 0.32 * len(layout.rows))
    axes = figure.add_subplot()
    cmap = "RdYlGn" if metric == "auroc" else "RdYlGn_r"
    image = axes.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=100, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            flag = "†" if metric == "auroc" and v < LOW_AUROC else ""
            axes.text(j, i, f"{v:.1f}{flag}", ha="center", va="center", fontsize="x-small",
                      color="white" if (v < 20 or v > 85) else "black", fontweight="bold" if flag else "normal")
    axes.set_xticks(range(len(layout.sets)), layout.sets, rotation=40, ha="right")
    axes.set_yticks(range(len(layout.rows)), [method_label(m) for m in layout.methods])
    _separators(axes, layout)
    label = COLUMN_LABELS[metric]
    figure.colorbar(image, ax=axes, label=f"{label} (%)", shrink=0.8, pad=0.12)
    better = "lower" if metric == "fpr95" else "higher"
    flag_note = f"; † AUROC < {LOW_AUROC:.0f}" if metric == "auroc" else ""
    axes.set_title(f"{label} per method and OOD set ({better} is better{flag_note})", fontsize="medium")
    return figure


# -- ROC curves -------------------------------------------------------------------------------------------------------
def roc_points(id_scores: np.ndarray, ood_scores: np.ndarray, limit: int = ROC_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) with OOD positive, one point per distinct score v (flag OOD iff score <= v), from (0, 0); thinned to
    at most `limit` points, the ends kept."""
    values = np.unique(np.r_[id_scores, ood_scores])
    tpr = np.searchsorted(np.sort(ood_scores), values, side="right") / len(ood_scores)
    fpr = np.searchsorted(np.sort(id_scores), values, side="right") / len(id_scores)
    fpr, tpr = np.r_[0.0, fpr], np.r_[0.0, tpr]
    if len(fpr) > limit:
        keep = np.unique(np.linspace(0, len(fpr) - 1, limit).round().astype(int))
        fpr, tpr = fpr[keep], tpr[keep]
    return fpr, tpr


def roc_figure(curves: Sequence[tuple[str, np.ndarray, np.ndarray, float]], ood_set: str) -> Any:
    """ROC curves of every method on one OOD set (OOD = positive), AUROC in the legend. `curves`: (method, ID scores,
    OOD scores, AUROC in percent)."""
    figure = new_figure(8.0, 5.0)
    axes = figure.add_subplot()
    for style, (method, id_scores, ood_scores, value) in zip(styles(len(curves)), curves):
        fpr, tpr = roc_points(id_scores, ood_scores)
        flag = " †" if value < LOW_AUROC else ""
        axes.plot(fpr, tpr, **style.kwargs(), markevery=max(1, len(fpr) // 6), markersize=4, linewidth=1.3,
                  label=f"{method_label(method)} ({value:.1f}{flag})")
    axes.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle=":")
    axes.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="ID rejected (FPR)", ylabel="OOD detected (TPR)")
    axes.set_title(f"ROC on {ood_set} (OOD positive); legend: AUROC %", fontsize="medium")
    axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), ncols=1 + len(curves) // 25)
    return figure


# -- score densities --------------------------------------------------------------------------------------------------
def robust_limits(values: np.ndarray) -> tuple[float, float]:
    """The `ROBUST` percentiles of the finite `values`, widened a little when they coincide."""
    finite = values[np.isfinite(values)]
    lo, hi = np.percentile(finite, ROBUST) if finite.size else (0.0, 1.0)
    if hi <= lo:
        pad = max(abs(lo) * 1e-3, 1e-6)
        lo, hi = lo - pad, hi + pad
    return float(lo), float(hi)


@dataclass(frozen=True)
class ScoreAxis:
    """The x axis of a method's density panels: linear, or, when the scores span far more than the ID scores' spread
    (GRAM's deviations), log-scaled distance from the ID median, t(x) = sign(x - m) log(1 + |x - m| / c)."""

    lo: float
    hi: float
    center: float = 0.0
    scale: float = 0.0  # c; 0 means linear

    @classmethod
    def of(cls, rows: pd.DataFrame, spread: float = 50.0) -> "ScoreAxis":
        lo, hi = robust_limits(rows["score"].to_numpy(np.float64))
        ids = rows.loc[rows["role"] == "id", "score"].to_numpy(np.float64)
        iqr = float(np.subtract(*np.percentile(ids, [75, 25]))) if len(ids) else 0.0
        if iqr > 0 and hi - lo > spread * iqr:
            return cls(lo, hi, float(np.median(ids)), iqr)
        return cls(lo, hi)

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return x if not self.scale else np.sign(x - self.center) * np.log1p(np.abs(x - self.center) / self.scale)

    def inverse(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        return t if not self.scale else self.center + np.sign(t) * self.scale * np.expm1(np.abs(t))

    def edges(self, bins: int) -> np.ndarray:
        return self.inverse(np.linspace(self.forward(self.lo), self.forward(self.hi), bins + 1))

    def apply(self, axes: Any) -> None:
        axes.set_xlim(self.lo, self.hi)
        if self.scale:
            axes.set_xscale("function", functions=(self.forward, self.inverse))
            ticks = self.inverse(np.linspace(self.forward(self.lo), self.forward(self.hi), 4))
            axes.set_xticks(ticks, [_tick(v, self.hi - self.lo) for v in ticks], fontsize="small")
        else:
            axes.locator_params(axis="x", nbins=5)
        label = "score (higher = more ID)" + ("; log distance from ID median" if self.scale else "")
        axes.set_xlabel(label, fontsize="small")


def _tick(value: float, span: float) -> str:
    if abs(value) < 1e-9 * span:
        return "0"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _stairs(axes: Any, values: np.ndarray, edges: np.ndarray, label: str, style: Style) -> None:
    """The share of `values` per bin as an outline (one `np.histogram`); values outside the edges count in the total
    but are not drawn."""
    counts, _ = np.histogram(values, bins=edges)
    outside = len(values) - int(counts.sum())
    note = f", {outside} outside" if outside else ""
    axes.stairs(counts / max(len(values), 1), edges, color=style.color, linestyle=style.linestyle, linewidth=1.6,
                label=f"{label} (n={len(values)}{note})")


Panel = tuple[str, np.ndarray, np.ndarray, tuple[str, str], float]
"""(title, reference scores, OOD scores, their labels, AUROC in percent)."""


def density_figure(method: str, panels: Sequence[Panel], axis: ScoreAxis, bins: int = 40) -> Any:
    """One panel per OOD set (and field set): the reference (ID test, or the field set's known rows) and the OOD score
    distributions as outlines (share of each set per bin), AUROC in the panel title, x limits at the `ROBUST`
    percentiles of the method's scores (a log-distance axis when they span far more than the ID scores, `ScoreAxis`)."""
    edges = axis.edges(bins)
    ncols = min(3, max(len(panels), 1))
    nrows = max(1, -(-len(panels) // ncols))
    figure, grid = grid_figure(nrows, ncols, (3.6, 2.3), margins=(0.75, 0.2, 0.75, 0.55), gaps=(0.85, 0.8))
    for axes in grid.ravel()[len(panels):]:
        figure.delaxes(axes)
    reference, ood = Style("black", "", "-"), Style(COLORS[1], "", "--")
    for axes, (name, ref_scores, ood_scores, labels, value) in zip(grid.ravel(), panels):
        _stairs(axes, ref_scores, edges, labels[0], reference)
        _stairs(axes, ood_scores, edges, labels[1], ood)
        flag = " †" if value < LOW_AUROC else ""
        axes.set_title(f"{name}: AUROC {value:.2f}{flag}", fontsize="medium", color="C3" if flag else "black")
        axis.apply(axes)
        axes.set_ylabel("share per bin", fontsize="small")
        axes.legend(fontsize="x-small")
    figure.suptitle(f"{method_label(method)}: score distributions (x axis: {ROBUST[0]}-{ROBUST[1]} percentiles)")
    return figure


def kde(values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """A Gaussian kernel density of `values` on the evenly spaced `grid` (Scott's bandwidth), binned: one histogram on
    the grid, convolved with the kernel (exact up to the grid's spacing; O(grid log grid), not O(n x grid))."""
    values = values[np.isfinite(values)]
    if values.size < 2 or np.std(values) == 0:
        return np.zeros_like(grid)
    step = grid[1] - grid[0]
    bandwidth = max(np.std(values, ddof=1) * values.size ** (-1 / 5), step)
    counts, _ = np.histogram(values, bins=np.r_[grid - step / 2, grid[-1] + step / 2])
    half = int(min(4 * bandwidth / step, len(grid)))
    offsets = np.arange(-half, half + 1) * step
    kernel = np.exp(-0.5 * (offsets / bandwidth) ** 2)
    kernel /= kernel.sum() * step
    return np.convolve(counts, kernel, mode="same") / values.size


def best_densities_figure(panels: Sequence[tuple[str, dict[str, np.ndarray]]], points: int = 512) -> Any:
    """ShiftedBronzes Figure 6: per method, the densities of ID test scores and of the pooled OOD scores of each group
    (hard, easy), x limits at the `ROBUST` percentiles of the method's scores. `panels`: (method, {series: scores})."""
    figure, grid = grid_figure(1, len(panels), (4.0, 2.8), margins=(0.75, 0.2, 0.75, 0.55), gaps=(0.85, 0.8))
    grid = grid[0]
    for axes, (method, series) in zip(grid, panels):
        lo, hi = robust_limits(np.concatenate(list(series.values())))
        xs = np.linspace(lo, hi, points)
        for i, (name, values) in enumerate(series.items()):
            style = Style("black", "", "-") if name == "ID" else _group_style(name, i)
            axes.plot(xs, kde(values, xs), color=style.color, linestyle=style.linestyle, linewidth=1.6,
                      label=f"{name} (n={len(values)})")
            axes.fill_between(xs, kde(values, xs), color=style.color, alpha=0.12, linewidth=0)
        axes.set(xlim=(lo, hi), xlabel="score (higher = more ID)", ylabel="density")
        axes.locator_params(axis="x", nbins=5)
        axes.set_title(method_label(method), fontsize="medium")
        axes.legend(fontsize="x-small")
    figure.suptitle("Score densities of the two best methods: ID vs pooled hard and easy OOD")
    return figure


# -- FPR@95 by method, grouped by family (ShiftedBronzes Figure 5) ----------------------------------------------------
def _family_positions(layout: Layout) -> tuple[np.ndarray, list[tuple[str, float, float]]]:
    """x of each method (a gap between families) and (family, first x, last x)."""
    xs, spans, x = [], [], 0.0
    for family, methods in layout.families.items():
        spans.append((family, x, x + len(methods) - 1))
        xs += [x + i for i in range(len(methods))]
        x += len(methods) + 1
    return np.array(xs), spans


def fpr95_figure(summary: pd.DataFrame, layout: Layout) -> Any:
    """FPR@95 per method, methods grouped by family: a marker per group mean and per all-set mean, a line at the means
    over all methods of each (the all / hard / easy average lines); series differ by marker and line style.
    `summary` is `method_summary`."""
    xs, spans = _family_positions(layout)
    figure = new_figure(max(6.5, 0.42 * len(xs) + 3.5), 4.8)
    axes = figure.add_subplot()
    for i, name in enumerate([ALL, *layout.groups]):
        values = np.clip(summary[(f"{name} avg", "fpr95")].to_numpy(np.float64), 0, 100)
        style = _group_style(name, i)
        axes.plot(xs, values, style.marker, color=style.color, markersize=6, label=name,
                  markerfacecolor="none" if name != ALL else style.color)
        if np.isfinite(values).any():
            axes.axhline(np.nanmean(values), color=style.color, linestyle=style.linestyle, linewidth=1.1,
                         label=f"{name} mean")
    for family, first, last in spans:
        axes.text((first + last) / 2, 1.02, family_label(family), transform=axes.get_xaxis_transform(), ha="center",
                  fontweight="bold", fontsize="small")
        if last < xs.max():
            axes.axvline(last + 1, color="grey", linewidth=0.8, linestyle=":")
    axes.set_xticks(xs, [method_label(m) for m in layout.methods], rotation=90, fontsize="small")
    axes.set(ylabel="FPR@95 (%)", ylim=(-3, 103), xlim=(xs.min() - 0.7, xs.max() + 0.7))
    axes.set_title("FPR@95 per method, grouped by family (lower is better)", pad=20, fontsize="medium")
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


# -- few-shot (ShiftedBronzes Figure 7) -------------------------------------------------------------------------------
def _bounded(mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Error-bar lengths (below, above) of mean +- std cut to [0, 100]."""
    return np.vstack([np.minimum(std, mean), np.minimum(std, 100 - mean)]).clip(min=0)


def fewshot_figure(frame: pd.DataFrame, metrics: Sequence[str] = ("auroc", "fpr95")) -> Any:
    """ID accuracy, then each metric per OOD group, against shots per class (mean +- std over seeds and the group's
    sets, bars cut to [0, 100]); one panel per (metric, group) and no empty panel; methods differ by colour, marker
    and line style and are nudged apart on x so that none hides another. `frame`: the runner's `fewshot.csv`."""
    groups = list(dict.fromkeys(frame["group"].fillna("other").astype(str)))
    panels = [("id_acc", None)] + [(m, g) for m in metrics for g in groups]
    figure, grid = grid_figure(1, len(panels), (2.6, 2.4), gaps=(0.55, 0.6))
    grid = grid[0]
    methods = list(dict.fromkeys(frame["method"]))
    shots = sorted(frame["shots"].unique())
    for axes, (metric, group) in zip(grid, panels):
        if group is None:
            data = frame.drop_duplicates(["method", "shots", "seed"])
        else:
            data = frame[frame["group"].fillna("other").astype(str) == group]
        for k, (style, method) in enumerate(zip(styles(len(methods)), methods)):
            stats = data[data["method"] == method].groupby("shots")[metric].agg(["mean", "std"]).fillna(0.0)
            nudge = 2.0 ** ((k - (len(methods) - 1) / 2) * 0.06)
            mean = stats["mean"].to_numpy(np.float64)
            axes.errorbar(stats.index.to_numpy(np.float64) * nudge, mean, yerr=_bounded(mean, stats["std"].to_numpy()),
                          capsize=3, markersize=5, linewidth=1.3, **style.kwargs(), label=method_label(method))
        axes.set_xscale("log", base=2)
        axes.set_xticks(shots, [str(s) for s in shots])
        axes.minorticks_off()
        axes.set(xlabel="shots per class", ylim=(-2, 102))
        label = "ID accuracy (%)" if group is None else f"{COLUMN_LABELS.get(metric, metric)} (%), {group}"
        axes.set_title(label, fontsize="medium")
    grid[0].legend(fontsize="x-small")
    return figure


# -- AUROC distributions (Open-Insects Figure 1) ----------------------------------------------------------------------
def auroc_distribution_figure(frame: pd.DataFrame) -> Any:
    """Per OOD type (x) and region (one box each, side by side), the distribution of AUROC over methods, with each
    method as a point. `frame`: columns `region, ood_set, method, auroc` (percent)."""
    types = list(dict.fromkeys(frame["ood_set"]))
    regions = list(dict.fromkeys(frame["region"]))
    figure = new_figure(max(5.0, 1.6 * len(types) * max(len(regions), 1) ** 0.5 + 2.5), 4.2)
    axes = figure.add_subplot()
    width = 0.8 / len(regions)
    rng = np.random.default_rng(0)
    for r, (style, region) in enumerate(zip(styles(len(regions)), regions)):
        data = [frame.loc[(frame["region"] == region) & (frame["ood_set"] == t), "auroc"].to_numpy(np.float64)
                for t in types]
        positions = np.arange(len(types)) + (r - (len(regions) - 1) / 2) * width
        filled = [(p, d) for p, d in zip(positions, data) if len(d)]
        axes.boxplot([d for _, d in filled], positions=[p for p, _ in filled], widths=width * 0.8, showfliers=False,
                     patch_artist=True, boxprops={"facecolor": "none", "edgecolor": style.color, "linestyle": style.linestyle},
                     medianprops={"color": style.color}, whiskerprops={"color": style.color},
                     capprops={"color": style.color})
        for p, d in filled:
            axes.plot(p + rng.uniform(-width / 4, width / 4, len(d)), d, style.marker, color=style.color, markersize=3.5,
                      alpha=0.7, linestyle="none")
        axes.plot([], [], style.marker, color=style.color, linestyle=style.linestyle, label=region)
    axes.set_xticks(range(len(types)), types)
    axes.set(ylabel="AUROC (%)", ylim=(-2, 102), xlim=(-0.6, len(types) - 0.4))
    axes.set_title("AUROC across methods per OOD type and region", fontsize="medium")
    axes.legend(fontsize="small", title="region")
    return figure


# -- thumbnail sheets -------------------------------------------------------------------------------------------------
TILE = 128
"""Thumbnail side in pixels."""
CAPTION = 44
"""Caption strip under each thumbnail, in pixels."""


@dataclass(frozen=True)
class Tile:
    """One thumbnail of a sheet: image `path`, its caption `lines`, an optional frame colour and a `mark` word that
    says what the frame says (so that it is not told by colour alone)."""

    path: str
    lines: tuple[str, ...]
    frame: str | None = None


def thumbnail(path: str | os.PathLike, size: int = TILE) -> np.ndarray | None:
    """RGB pixels of `path` at most `size` x `size`, decoded once at reduced scale (JPEG draft mode), or None when it
    cannot be read."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.draft("RGB", (size, size))
            image = image.convert("RGB")
            image.thumbnail((size, size))
            return np.asarray(image)
    except (OSError, ValueError, Image.DecompressionBombError):
        return None


def _rgb(color: str) -> np.ndarray:
    from matplotlib.colors import to_rgb

    return (np.array(to_rgb(color)) * 255).astype(np.uint8)


def sheet_figure(rows: Sequence[tuple[str, Sequence[Tile]]], title: str) -> Any:
    """A thumbnail sheet as ONE image: a row per (label, tiles), each tile a thumbnail with its caption lines under it
    and, when given, a frame in its colour."""
    ncols = max([len(t) for _, t in rows] + [1])
    cell_w, cell_h = TILE + 8, TILE + CAPTION
    mosaic = np.full((len(rows) * cell_h, ncols * cell_w, 3), 255, dtype=np.uint8)
    captions = []
    for i, (_, tiles) in enumerate(rows):
        for j, tile in enumerate(tiles):
            y0, x0 = i * cell_h, j * cell_w + 4
            if tile.frame:
                mosaic[y0:y0 + TILE + 6, x0 - 3:x0 + TILE + 3] = _rgb(tile.frame)
                mosaic[y0 + 3:y0 + TILE + 3, x0:x0 + TILE] = 255
            pixels = thumbnail(tile.path)
            if pixels is not None:
                h, w = pixels.shape[:2]
                top, left = y0 + 3 + (TILE - h) // 2, x0 + (TILE - w) // 2
                mosaic[top:top + h, left:left + w] = pixels
            lines = tile.lines if pixels is not None else ("unreadable", *tile.lines)
            captions.append((x0 + TILE / 2, y0 + TILE + 8, "\n".join(lines)))
    left, top, bottom = 1.7, 0.5, 0.1  # inches: row labels, title; the mosaic itself maps 1:1 to pixels at DPI
    height, width = mosaic.shape[0] / DPI, mosaic.shape[1] / DPI
    figure = new_figure(width + left + 0.1, height + top + bottom)
    figure.set_layout_engine(None)  # a fixed layout: one draw
    total_w, total_h = figure.get_size_inches()
    axes = figure.add_axes((left / total_w, bottom / total_h, width / total_w, height / total_h))
    axes.imshow(mosaic, interpolation="nearest")
    for x, y, text in captions:
        axes.text(x, y, text, ha="center", va="top", fontsize=4.5, linespacing=1.1)
    axes.set_yticks([i * cell_h + TILE / 2 for i in range(len(rows))], [label for label, _ in rows], fontsize="small")
    axes.set_xticks([])
    for spine in axes.spines.values():
        spine.set_visible(False)
    axes.tick_params(length=0)
    figure.text(0.5, 1 - 0.06 / total_h, textwrap.fill(title, max(30, int(total_w / 0.085))), ha="center", va="top",
                fontsize="small")
    return figure


def short(text: str, n: int = 24) -> str:
    return text if len(text) <= n else text[: n // 2 - 1] + "…" + text[-(n // 2):]


def id_looking_sheet(rows: pd.DataFrame, ood_set: str) -> Any:
    """A sheet for one OOD set: a row per method, its most ID-looking OOD images left to right, each captioned with
    rank, score, the percent of ID test scores below it, its species and original file name. `rows` is
    `id_looking_table` for that set, with `path` (and `species`) columns."""
    out = []
    for method, part in rows.groupby("method", sort=False):
        tiles = [Tile(str(r["path"]), (f"#{int(r['rank'])} {r['score']:.3g} ({r['id_share']:.0f}%)",
                                       short(str(r.get("species") or "")), short(Path(str(r["file_name"])).name)))
                 for _, r in part.sort_values("rank").iterrows()]
        out.append((method_label(method), tiles))
    return sheet_figure(out, f"{ood_set}: most ID-looking OOD images (score; % of ID test scores below; species; file)")


def field_sheet(rows: pd.DataFrame, title: str) -> Any:
    """Open-Insects Figure 3: a field set's novel-species images, a row per species, each framed red and captioned
    `flagged` when its score is below the transferred threshold, grey and `missed` otherwise. `rows`: columns
    `species, path, file_name, score, flagged`."""
    out = []
    for species, part in rows.groupby("species", sort=False):
        tiles = [Tile(str(r["path"]), ("flagged" if r["flagged"] else "missed", short(Path(str(r["file_name"])).name)),
                      COLORS[1] if r["flagged"] else "#b0b0b0") for _, r in part.iterrows()]
        out.append((short(str(species), 28), tiles))
    return sheet_figure(out, title)



__all__ = ["ROBUST", "ROC_POINTS", "GROUP_STYLES", "ScoreAxis", "Panel", "Tile", "TILE", "safe_name", "robust_limits",
           "roc_points", "kde", "thumbnail", "short", "heatmap_figure", "roc_figure", "density_figure",
           "best_densities_figure", "fpr95_figure", "fewshot_figure", "auroc_distribution_figure", "sheet_figure",
           "id_looking_sheet", "field_sheet"]
