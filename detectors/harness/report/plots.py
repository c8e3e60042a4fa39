"""The report's figures, each a `*_figure(...)` that returns a matplotlib Figure (saved by `figures.save_figure`, or
made in worker processes by `figures.render`): AUROC / FPR@95 heatmaps, ROC curves (a panel per set), the score
densities of every method (a row per method, a column per set), FPR@95 by method grouped by family (ShiftedBronzes
Figure 5), the two best methods' densities (Figure 6), few-shot curves (Figure 7), feature maps side by side (Figure
2(c)), AUROC distributions per OOD type and region (Open-Insects Figure 1) and thumbnail sheets (the most ID-looking
OOD images; a field set's novel species flagged or missed, Open-Insects Figure 3).

Builders take plain arrays and frames and draw every series with its own colour, marker and line style
(`figures.styles`); series that can coincide are nudged apart and drawn with their own markers (the figure says so).
Heavy-tailed scores get a robust axis (`ScoreAxis`: the 0.5-99.5 percentiles, and a signed log distance from the ID
median when the scores span far more than the ID spread; the axis label names it). Histograms and densities are
computed with numpy (one `np.histogram` per series, a binned Gaussian KDE); thumbnails are decoded once at reduced
size (PIL `draft` + `thumbnail`, memoised by path) into one mosaic image.
"""
from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from detectors.harness.report.figures import COLORS, DPI, JPEG_QUALITY, Style, grid_figure, styles, text_inches
from detectors.harness.report.names import Paper, family_label, group_label, method_label, set_label
from detectors.harness.report.tables import ALL, LOW_AUROC, Layout
from detectors.harness.results import COLUMN_LABELS, LOWER_IS_BETTER
from pipelines.io import safe_name

ROBUST = (0.5, 99.5)
"""Percentiles of a method's pooled scores that bound its density plots' x axis (heavy tails, e.g. GRAM, would
otherwise squeeze every histogram into one bin)."""
ROC_POINTS = 500
"""At most this many points per ROC curve (evenly spaced along the curve's distinct thresholds, ends kept): more than
a 3-inch panel at 150 DPI shows."""
HARD, EASY = "#2ca02c", "#d62728"
GROUP_STYLES = {ALL: Style("black", "o", "-"), "hard": Style(HARD, "^", "--"), "easy": Style(EASY, "s", ":")}
"""ShiftedBronzes' group colours (its Figure 5: green hard, red easy; all black), each with its own marker and line
style as well."""
GROUP_OFFSET = 0.24
"""Figure 5: the all / hard / easy markers of a method sit this far apart on x, so that equal values stay visible."""
MODEL_LABELS = {"resnet-50": "ResNet-50", "resnet50": "ResNet-50", "vit-base-patch16-224": "ViT-B/16",
                "vit_b_16": "ViT-B/16", "vit-b-16": "ViT-B/16", "clip-vit-base-patch16": "CLIP ViT-B/16",
                "clip-vit-base-patch32": "CLIP ViT-B/32", "clip-vit-large-patch14": "CLIP ViT-L/14"}
"""Display names of the feature-map models the papers use (Figure 2(c): ResNet-50 and ViT-B/16)."""


def model_label(name: str) -> str:
    """A model's display name from its folder or hub name (`openai_clip-vit-base-patch16` -> `CLIP ViT-B/16`)."""
    key = name.lower().rsplit("_", 1)[-1] if name.lower() not in MODEL_LABELS else name.lower()
    return MODEL_LABELS.get(name.lower(), MODEL_LABELS.get(key, name))


def _group_style(name: str, i: int) -> Style:
    """The style of group `name` ('hard OOD' is 'hard'); other groups take the palette's i-th style after them."""
    return GROUP_STYLES.get(name.removesuffix(" OOD")) or styles(i + 4)[i + 3]


def _names(paper: Paper | None):
    return lambda method: method_label(method, paper)


# -- heatmap ----------------------------------------------------------------------------------------------------------
def _separators(axes: Any, layout: Layout, family_names: bool = True) -> None:
    """Lines between families (rows) and groups (columns), family names at the right, group names on top."""
    row = 0
    for family, methods in layout.families.items():
        if family_names:
            axes.text(1.01, row + (len(methods) - 1) / 2, family_label(family), transform=axes.get_yaxis_transform(),
                      va="center", fontsize="small", fontweight="bold")
        row += len(methods)
        if row < len(layout.methods):
            axes.axhline(row - 0.5, color="black", linewidth=1.5)
    col, centers = 0, []
    for group, sets in layout.groups.items():
        centers.append((col + (len(sets) - 1) / 2, group_label(group)))
        col += len(sets)
        if col < len(layout.sets):
            axes.axvline(col - 0.5, color="black", linewidth=1.5)
    top = axes.secondary_xaxis("top")
    top.set_xticks([c for c, _ in centers], [g for _, g in centers], fontweight="bold")
    top.tick_params(length=0)


def heatmap_figure(table: pd.DataFrame, layout: Layout, metrics: Sequence[str] = ("auroc", "fpr95"),
                   paper: Paper | None = None) -> Any:
    """Methods (grouped by family) x OOD sets (grouped by group), one panel per metric side by side (AUROC, FPR@95;
    percent), coloured green = better in each and every cell annotated (so no colour bar is needed); AUROC below 50
    is marked with a dagger. `table` is `per_set_table(averages=False)`. A fixed layout: margins from the labels."""
    methods = [method_label(m, paper) for m in layout.methods]
    sets = [set_label(s) for s in layout.sets]
    left = text_inches(methods, 10) + 0.2
    right = text_inches([family_label(f) for f in layout.families], 8.5) + 0.3
    bottom = text_inches(sets, 10) * 0.65 + 0.3
    names = " and ".join(COLUMN_LABELS[m] for m in metrics)
    title = f"{names} per method and OOD set (green = better; † AUROC < {LOW_AUROC:.0f})"
    width = max(0.8 * len(layout.sets), (text_inches([title], 11) + 0.3 - left - right) / len(metrics))
    figure, grid = grid_figure(1, len(metrics), (width, 0.3 * len(layout.rows)), margins=(left, right, 0.75, bottom),
                               gaps=(0.25, 0.3))
    for k, (axes, metric) in enumerate(zip(grid[0], metrics)):
        values = np.array([[table.loc[(f, m), (s, metric)] for s in layout.sets] for f, m in layout.rows],
                          dtype=np.float64)
        cmap = "RdYlGn_r" if LOWER_IS_BETTER[metric] else "RdYlGn"
        axes.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=100, aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            if np.isfinite(v):
                flag = "†" if metric == "auroc" and v < LOW_AUROC else ""
                axes.text(j, i, f"{v:.1f}{flag}", ha="center", va="center", fontsize="x-small",
                          color="white" if (v < 20 or v > 85) else "black", fontweight="bold" if flag else "normal")
        axes.set_xticks(range(len(layout.sets)), sets, rotation=40, ha="right")
        axes.set_yticks(range(len(layout.rows)), methods)
        axes.tick_params(axis="y", labelleft=k == 0)
        _separators(axes, layout, family_names=k == len(metrics) - 1)
        axes.set_title(f"{COLUMN_LABELS[metric]} (%)", fontsize="medium", pad=16)
    figure.suptitle(title, fontsize="medium", y=1 - 0.05 / figure.get_size_inches()[1], va="top")
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


Curve = tuple[str, np.ndarray, np.ndarray, float]
"""(method, ID scores, OOD scores, AUROC in percent)."""


def roc_figure(panels: Sequence[tuple[str, Sequence[Curve]]], paper: Paper | None = None) -> Any:
    """ROC curves of every method, one panel per OOD set (OOD = positive); the methods' styles are the same in every
    panel, so one legend (method and its AUROC per set) serves them all."""
    ncols = min(3, max(len(panels), 1))
    nrows = max(1, -(-len(panels) // ncols))
    methods = list(dict.fromkeys(m for _, curves in panels for m, *_ in curves))
    legend_w = (text_inches([method_label(m, paper) for m in methods], 8.5) + 0.34 * len(panels) + 0.8) * \
        (1 + len(methods) // 28)
    figure, grid = grid_figure(nrows, ncols, (3.0, 2.8), margins=(0.6, legend_w, 0.45, 0.5), gaps=(0.3, 0.65))
    for axes in grid.ravel()[len(panels):]:
        figure.delaxes(axes)
    style = dict(zip(methods, styles(len(methods))))
    aurocs: dict[str, list[str]] = {m: [] for m in methods}
    for axes, (ood_set, curves) in zip(grid.ravel(), panels):
        for method, id_scores, ood_scores, _value in curves:
            fpr, tpr = roc_points(id_scores, ood_scores)
            axes.plot(fpr, tpr, **style[method].kwargs(), markevery=max(1, len(fpr) // 5), markersize=3, linewidth=1.1)
        for method in methods:
            value = next((c[3] for c in curves if c[0] == method), np.nan)
            aurocs[method].append("–" if not np.isfinite(value) else f"{value:.1f}{'†' if value < LOW_AUROC else ''}")
        axes.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle=":")
        axes.set(xlim=(0, 1), ylim=(0, 1.01), xticks=[0, 0.5, 1], yticks=[0, 0.5, 1])
        axes.set_xlabel("ID rejected (FPR)", fontsize="small")
        if axes.get_subplotspec().is_first_col():
            axes.set_ylabel("OOD detected (TPR)", fontsize="small")
        else:
            axes.tick_params(labelleft=False)
        axes.tick_params(labelsize="small")
        axes.set_title(set_label(ood_set), fontsize="medium")
    handles = [figure.axes[0].plot([], [], **style[m].kwargs())[0] for m in methods]
    labels = [f"{method_label(m, paper)} ({', '.join(aurocs[m])})" for m in methods]
    figure.legend(handles, labels, loc="upper right", fontsize="small", title="method (AUROC per panel)",
                  title_fontsize="small", ncols=1 + len(methods) // 28, frameon=False)
    figure.suptitle("ROC curves per OOD set (OOD positive)", fontsize="medium")
    return figure


# -- score axes and densities
# -------------------------------------------------------------------------------------------
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
    """The x axis of a method's score plots: the `ROBUST` percentiles of its scores, linear, or, when they span far
    more than the ID scores' spread (GRAM's deviations), the signed log distance from the ID median,
    t(x) = sign(x - m) log(1 + |x - m| / c), c the ID interquartile range. The label names which."""

    lo: float
    hi: float
    center: float = 0.0
    scale: float = 0.0  # c; 0 means linear

    @classmethod
    def of(cls, rows: pd.DataFrame, spread: float = 50.0) -> ScoreAxis:
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

    def unit(self, x: np.ndarray) -> np.ndarray:
        """x mapped to [0, 1] over the axis (forward-transformed)."""
        lo, hi = self.forward(self.lo), self.forward(self.hi)
        return (self.forward(x) - lo) / (hi - lo)

    def edges(self, bins: int) -> np.ndarray:
        return self.inverse(np.linspace(self.forward(self.lo), self.forward(self.hi), bins + 1))

    @property
    def label(self) -> str:
        clip = f"{ROBUST[0]}-{ROBUST[1]} percentiles"
        return ("score: signed log distance from the ID median" if self.scale else "score") + f" ({clip})"

    def apply(self, axes: Any) -> None:
        axes.set_xlim(self.lo, self.hi)
        if self.scale:
            axes.set_xscale("function", functions=(self.forward, self.inverse))
            ticks = self.inverse(np.linspace(self.forward(self.lo), self.forward(self.hi), 4))
            axes.set_xticks(ticks, [_tick(v, self.hi - self.lo) for v in ticks], fontsize="small")
        else:
            axes.locator_params(axis="x", nbins=5)
        axes.set_xlabel(self.label, fontsize="small")


def _tick(value: float, span: float) -> str:
    if abs(value) < 1e-9 * span:
        return "0"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


Panel = tuple[str, np.ndarray, np.ndarray, tuple[str, str], float]
"""(title, reference scores, OOD scores, their labels, AUROC in percent)."""


def densities_figure(rows: Sequence[tuple[str, Sequence[Panel], ScoreAxis]], paper: Paper | None = None,
                     bins: int = 32) -> Any:
    """Every method's score distributions in one figure: a row per method, a column per set (its panels: each OOD
    set, then each field set), the reference (ID test, or the field set's known rows; black) against the OOD rows
    (red, dashed) as histogram outlines scaled to the row's height (one line collection per colour and axes; the
    AUROCs are Table 3's and the ROC legend's). Each row's x runs over its method's
    `ScoreAxis` mapped to [0, 1] (the axis label says so): one figure, one axes per column, whatever the number of
    methods."""
    from matplotlib.collections import LineCollection

    columns = list(dict.fromkeys(p[0] for _, panels, _ in rows for p in panels))
    figure, grid = grid_figure(1, max(len(columns), 1), (2.3, 0.26 * len(rows) + 0.2),
                               margins=(2.4, 0.2, 0.55, 0.55), gaps=(0.3, 0.2))
    grid = grid[0]
    for c, (axes, name) in enumerate(zip(grid, columns)):
        outlines: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        for i, (_method, panels, axis) in enumerate(rows):
            panel = next((p for p in panels if p[0] == name), None)
            base = len(rows) - 1 - i
            if panel is None:
                continue
            _, ref, ood, _, value = panel
            edges = axis.edges(bins)
            counts = [np.histogram(v, bins=edges)[0] / max(len(v), 1) for v in (ref, ood)]
            top = max(float(np.max(counts[0], initial=0)), float(np.max(counts[1], initial=0)), 1e-12)
            x = np.repeat(axis.unit(edges), 2)[1:-1]
            for share, into in zip(counts, outlines):
                into.append(np.column_stack([x, base + 0.85 * np.repeat(share, 2) / top]))
        for lines, color, style in ((outlines[0], "black", "-"), (outlines[1], EASY, "--")):
            axes.add_collection(LineCollection(lines, colors=color, linestyles=style, linewidths=0.9), autolim=False)
        axes.set(xlim=(0, 1), ylim=(-0.1, len(rows)))
        axes.set_xticks([0, 1], [f"p{ROBUST[0]:g}", f"p{ROBUST[1]:g}"], fontsize="x-small")
        axes.set_title(set_label(name.removesuffix(" (field)")) + (" (field)" if name.endswith(" (field)") else ""),
                       fontsize="small")
        axes.tick_params(axis="y", length=0)
        axes.set_yticks([] if c else [len(rows) - 1 - i + 0.35 for i in range(len(rows))],
                        [] if c else [_density_label(m, a, paper) for m, _, a in rows], fontsize="x-small")
    figure.supxlabel(f"score per method: from its {ROBUST[0]} to its {ROBUST[1]} percentile, the values beside its "
                     "name (log: on the signed log distance from its ID median)", fontsize="x-small")
    figure.suptitle("Score distributions: ID test (black) vs the set (red, dashed)", fontsize="medium")
    return figure


def _density_label(method: str, axis: ScoreAxis, paper: Paper | None) -> str:
    """A density row's label: the method, `log` for a log axis, and the scores at the row's two ends (its axis)."""
    span = axis.hi - axis.lo
    return (f"{method_label(method, paper)}{' (log)' if axis.scale else ''}  "
            f"[{_tick(axis.lo, span)}, {_tick(axis.hi, span)}]")


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


def best_densities_figure(panels: Sequence[tuple[str, dict[str, np.ndarray], ScoreAxis]], points: int = 400) -> Any:
    """ShiftedBronzes Figure 6: per method (its display name), the densities of ID test scores and of the pooled OOD
    scores of each group (hard green, easy red), on the method's `ScoreAxis` (the 0.5-99.5 percentiles, a signed log
    distance from the ID median for heavy-tailed scores; the density is taken on that axis); the legend counts the
    values outside. `panels`: (label, {series: scores}, axis)."""
    figure, grid = grid_figure(1, len(panels), (4.0, 2.8), margins=(0.75, 0.2, 0.6, 0.6), gaps=(0.85, 0.8))
    grid = grid[0]
    for axes, (label, series, axis) in zip(grid, panels):
        t_grid = np.linspace(axis.forward(axis.lo), axis.forward(axis.hi), points)
        xs = axis.inverse(t_grid)
        for i, (name, values) in enumerate(series.items()):
            style = Style("black", "", "-") if name == "ID" else _group_style(name, i)
            t = axis.forward(values[np.isfinite(values)])
            inside = (t >= t_grid[0]) & (t <= t_grid[-1])
            density = kde(t[inside], t_grid) * inside.mean() if inside.any() else np.zeros_like(t_grid)
            outside = int((~inside).sum())
            legend = f"{name} (n={len(values)}" + (f", {outside} outside)" if outside else ")")
            axes.plot(xs, density, color=style.color, linestyle=style.linestyle, linewidth=1.6, label=legend)
            axes.fill_between(xs, density, color=style.color, alpha=0.12, linewidth=0)
        axis.apply(axes)
        axes.set_ylim(bottom=0)
        axes.set_ylabel("density (on this axis)", fontsize="small")
        axes.set_title(label, fontsize="medium")
        axes.legend(fontsize="x-small")
    figure.suptitle("Score densities of the two best methods: ID vs pooled hard and easy OOD", fontsize="medium")
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


def fpr95_figure(summary: pd.DataFrame, layout: Layout, paper: Paper | None = None) -> Any:
    """FPR@95 per method, methods grouped by family: per method its mean over all sets and over each group, side by
    side (`GROUP_OFFSET` apart) in the groups' colours and markers, and a line at the mean over all methods of each
    (the all / hard / easy average lines). `summary` is `method_summary`."""
    xs, spans = _family_positions(layout)
    labels = [method_label(m, paper) for m in layout.methods]
    title = "FPR@95 per method, grouped by family (lower is better; markers offset on x)"
    width = max(3.5, 0.42 * len(xs) + 0.5, text_inches([title], 10) - 0.7)  # a few methods: the title still fits
    figure, grid = grid_figure(1, 1, (width, 3.4), margins=(0.7, 1.7, 0.75, text_inches(labels, 8.5) + 0.25))
    axes = grid[0, 0]
    names = [ALL, *layout.groups]
    for i, name in enumerate(names):
        values = np.clip(summary[(f"{name} avg", "fpr95")].to_numpy(np.float64), 0, 100)
        style = _group_style(name, i)
        shift = (i - (len(names) - 1) / 2) * GROUP_OFFSET
        axes.plot(xs + shift, values, style.marker, color=style.color, markersize=6,
                  label=f"{group_label(name)} sets" if name != ALL else "All sets",
                  markerfacecolor="none" if name != ALL else style.color)
        if np.isfinite(values).any():
            axes.axhline(np.nanmean(values), color=style.color, linestyle=style.linestyle, linewidth=1.1,
                         label=f"{group_label(name)} mean")
    for family, first, last in spans:
        axes.text((first + last) / 2, 1.02, family_label(family), transform=axes.get_xaxis_transform(), ha="center",
                  fontweight="bold", fontsize="small")
        if last < xs.max():
            axes.axvline(last + 1, color="grey", linewidth=0.8, linestyle=":")
    axes.set_xticks(xs, labels, rotation=90, fontsize="small")
    axes.set(ylabel="FPR@95 (%)", ylim=(-3, 103), xlim=(xs.min() - 0.8, xs.max() + 0.8))
    axes.set_title(title, pad=20, fontsize="medium")
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


# -- few-shot (ShiftedBronzes Figure 7) -------------------------------------------------------------------------------
def _bounded(mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Error-bar lengths (below, above) of mean +- std cut to [0, 100]."""
    return np.vstack([np.minimum(std, mean), np.minimum(std, 100 - mean)]).clip(min=0)


def fewshot_figure(frame: pd.DataFrame, metrics: Sequence[str] = ("auroc", "fpr95"), paper: Paper | None = None) -> Any:
    """ID accuracy, then each metric per OOD group, against shots per class (mean +- std over seeds and the group's
    sets, bars cut to [0, 100]); one panel per (metric, group), each with its legend, and no empty panel; methods
    differ by colour, marker and line style and are nudged apart on x so that none hides another. `frame`: the
    runner's `fewshot.csv`."""
    groups = list(dict.fromkeys(frame["group"].fillna("other").astype(str)))
    panels = [("id_acc", None)] + [(m, g) for m in metrics for g in groups]
    figure, grid = grid_figure(1, len(panels), (2.7, 2.5), margins=(0.55, 0.15, 0.45, 0.55), gaps=(0.55, 0.6))
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
                          capsize=3, markersize=5, linewidth=1.3, **style.kwargs(), label=method_label(method, paper))
        axes.set_xscale("log", base=2)
        axes.set_xticks(shots, [str(s) for s in shots])
        axes.minorticks_off()
        axes.set(xlabel="shots per class", ylim=(-2, 102))
        label = "ID accuracy (%)" if group is None else f"{COLUMN_LABELS.get(metric, metric)} (%), {group_label(group)}"
        axes.set_title(label, fontsize="medium")
        axes.legend(fontsize="small", loc="best", framealpha=0.8)
    return figure


# -- feature maps (ShiftedBronzes Figure 2(c))
# --------------------------------------------------------------------------
def feature_maps_figure(panels: Sequence[tuple[str, pd.DataFrame]]) -> Any:
    """The feature maps side by side, one panel per model (its display title): a scatter of the 2-D embedding, one
    colour and marker per set (the same in every panel, so one legend serves them all), ID first."""
    figure, grid = grid_figure(1, len(panels), (4.2, 4.0), margins=(0.2, 0.2, 0.45, 1.0), gaps=(0.3, 0.3))
    sets = list(dict.fromkeys(s for _, points in panels for s in points["set"]))
    style = dict(zip(sets, styles(len(sets))))
    for axes, (title, points) in zip(grid[0], panels):
        for name, part in points.groupby("set", sort=False):
            axes.scatter(part["x"], part["y"], s=10, alpha=0.8, marker=style[name].marker, color=style[name].color,
                         linewidths=0)
        axes.set_xticks([])
        axes.set_yticks([])
        axes.set_title(title, fontsize="medium")
    handles = [figure.axes[0].scatter([], [], s=24, marker=style[s].marker, color=style[s].color) for s in sets]
    counts = {s: max(int((p["set"] == s).sum()) for _, p in panels) for s in sets}
    figure.legend(handles, [f"{set_label(s)} (n={counts[s]})" for s in sets], loc="lower center",
                  ncols=min(len(sets), 5), fontsize="small", frameon=False)
    return figure


# -- AUROC distributions (Open-Insects Figure 1) ----------------------------------------------------------------------
def auroc_distribution_figure(frame: pd.DataFrame) -> Any:
    """Per OOD type (x; the labels as given) and region (one box each, side by side), the distribution of AUROC over
    methods, each method a point; AUROC below 50 is left out, as the paper does (the title counts them). `frame`:
    columns `region, ood_set, method, auroc` (percent)."""
    low = int((frame["auroc"] < LOW_AUROC).sum())
    frame = frame[frame["auroc"] >= LOW_AUROC]
    types = list(dict.fromkeys(frame["ood_set"]))
    regions = list(dict.fromkeys(frame["region"]))
    figure, grid = grid_figure(1, 1, (max(3.0, 1.6 * len(types) * max(len(regions), 1) ** 0.5), 3.2),
                               margins=(0.7, 0.2, 0.45, 0.5))
    axes = grid[0, 0]
    width = 0.8 / max(len(regions), 1)
    rng = np.random.default_rng(0)
    for r, (style, region) in enumerate(zip(styles(len(regions)), regions)):
        data = [frame.loc[(frame["region"] == region) & (frame["ood_set"] == t), "auroc"].to_numpy(np.float64)
                for t in types]
        positions = np.arange(len(types)) + (r - (len(regions) - 1) / 2) * width
        filled = [(p, d) for p, d in zip(positions, data) if len(d)]
        axes.boxplot([d for _, d in filled], positions=[p for p, _ in filled], widths=width * 0.8, showfliers=False,
                     patch_artist=True,
                     boxprops={"facecolor": "none", "edgecolor": style.color, "linestyle": style.linestyle},
                     medianprops={"color": style.color}, whiskerprops={"color": style.color},
                     capprops={"color": style.color})
        for p, d in filled:
            axes.plot(p + rng.uniform(-width / 4, width / 4, len(d)), d, style.marker, color=style.color,
                      markersize=3.5, alpha=0.7, linestyle="none")
        axes.plot([], [], style.marker, color=style.color, linestyle=style.linestyle, label=region)
    axes.set_xticks(range(len(types)), types)
    axes.set(ylabel="AUROC (%)", ylim=(LOW_AUROC - 2, 101), xlim=(-0.6, len(types) - 0.4))
    dropped = f" ({low} below {LOW_AUROC:.0f} not shown)" if low else ""
    axes.set_title(f"AUROC across methods per OOD type and region{dropped}", fontsize="medium")
    axes.legend(fontsize="small", title="region")
    return figure


# -- thumbnail sheets -------------------------------------------------------------------------------------------------
TILE = 128
"""Thumbnail side in pixels; a smaller image is scaled up to fill it (`thumbnail`)."""
CAPTION_FONT = 12
"""Caption text in pixels: the page shows a sheet at its own size (up to the page's width), so 12 px stays readable."""
CAPTION = 4 * (CAPTION_FONT + 3) + 8
"""Caption strip under each thumbnail, in pixels (up to four lines)."""


@dataclass(frozen=True)
class Tile:
    """One thumbnail of a sheet: image `path`, its caption `lines`, an optional frame colour and a `mark` word that
    says what the frame says (so that it is not told by colour alone)."""

    path: str
    lines: tuple[str, ...]
    frame: str | None = None


def thumbnail(path: str | os.PathLike, size: int = TILE) -> np.ndarray | None:
    """RGB pixels of `path` fitting `size` x `size`, decoded once at reduced scale (JPEG draft mode), or None when it
    cannot be read; an image smaller than half the tile is scaled up by a whole factor with nearest-neighbour pixels
    (a 28 px digit becomes 112 px of sharp squares, not a blur); memoised by (path, size, mtime, bytes): the same image
    in several sheets is decoded once."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _thumbnail(str(path), size, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4096)
def _thumbnail(path: str, size: int, mtime_ns: int, nbytes: int) -> np.ndarray | None:
    from PIL import Image

    try:
        with Image.open(path) as image:
            scale = size / max(image.size)  # the thumbnail's own size: JPEG DCT scaling to the smallest that covers it
            image.draft("RGB", (max(1, int(image.size[0] * scale)), max(1, int(image.size[1] * scale))))
            image = image.convert("RGB")
            image.thumbnail((size, size))
            factor = size // max(image.size)
            if factor >= 2:
                image = image.resize((image.size[0] * factor, image.size[1] * factor), Image.NEAREST)
            return np.asarray(image)
    except (OSError, ValueError, Image.DecompressionBombError):
        return None


@lru_cache(maxsize=8)
def _font(size: int) -> Any:
    """DejaVu Sans (matplotlib's own font file) at `size` pixels, else PIL's default font."""
    from PIL import ImageFont

    try:
        import matplotlib

        return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"), size)
    except (ImportError, OSError):
        return ImageFont.load_default(size=size)


@dataclass
class Sheet:
    """A thumbnail sheet drawn as one image with PIL (no plotting pass): `save_figure` saves it like a Figure.
    `labels` are the row labels, `captions` the tiles' captions (for the tests and the page)."""

    image: Any
    title: str
    labels: list[str]
    captions: list[str]

    def savefig(self, path: Any, format: str = "png", dpi: float = DPI, pil_kwargs: dict | None = None,
                **_: Any) -> None:
        if format == "pdf":
            self.image.save(path, format="PDF", resolution=float(dpi))
        elif format == "jpeg":
            self.image.save(path, format="JPEG", dpi=(dpi, dpi), quality=JPEG_QUALITY)
        else:  # a PNG of photos: zlib level 1 (a photo mosaic hardly compresses further, at 4x the time)
            self.image.save(path, format=format.upper(), dpi=(dpi, dpi), **{**(pil_kwargs or {}), "compress_level": 1})


LABEL_WIDTH, TITLE_HEIGHT = 150, 44
"""Sheet pixels: the row-label column and the title strip (8 tiles a row: 1,246 px, within the page's width)."""


def sheet_figure(rows: Sequence[tuple[str, Sequence[Tile]]], title: str) -> Sheet:
    """A thumbnail sheet as ONE image: a row per (label, tiles), each tile a thumbnail with its caption lines under it
    and, when given, a frame in its colour; drawn with PIL at `DPI` (captions `CAPTION_FONT` px, labels 14 px)."""
    from PIL import Image, ImageDraw

    ncols = max([len(t) for _, t in rows] + [1])
    cell_w, cell_h = TILE + 8, TILE + CAPTION
    width = LABEL_WIDTH + ncols * cell_w + 8
    height = TITLE_HEIGHT + len(rows) * cell_h + 6
    sheet = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(sheet)
    small, label_font, title_font = _font(CAPTION_FONT), _font(14), _font(15)
    wrapped = textwrap.fill(title, max(30, width // 8))
    draw.multiline_text((width // 2, 6), wrapped, fill="black", font=title_font, anchor="ma", align="center", spacing=2)
    captions = []
    for i, (label, tiles) in enumerate(rows):
        y0 = TITLE_HEIGHT + i * cell_h
        draw.text((LABEL_WIDTH - 10, y0 + TILE // 2), short(label, 16), fill="black", font=label_font, anchor="rm")
        for j, tile in enumerate(tiles):
            x0 = LABEL_WIDTH + j * cell_w + 4
            if tile.frame:
                draw.rectangle((x0 - 3, y0, x0 + TILE + 2, y0 + TILE + 5), fill=tile.frame)
                draw.rectangle((x0, y0 + 3, x0 + TILE - 1, y0 + TILE + 2), fill="white")
            pixels = thumbnail(tile.path)
            if pixels is not None:
                h, w = pixels.shape[:2]
                sheet.paste(Image.fromarray(pixels), (x0 + (TILE - w) // 2, y0 + 3 + (TILE - h) // 2))
            lines = tile.lines if pixels is not None else ("unreadable", *tile.lines)
            text = "\n".join(lines)
            draw.multiline_text((x0 + TILE // 2, y0 + TILE + 8), text, fill="black", font=small, anchor="ma",
                                align="center", spacing=1)
            captions.append(text)
    return Sheet(sheet, title, [label for label, _ in rows], captions)


def short(text: str, n: int = 24) -> str:
    return text if len(text) <= n else text[: n // 2 - 1] + "…" + text[-(n // 2):]


def id_looking_sheet(rows: pd.DataFrame, ood_set: str, paper: Paper | None = None, note: str = "") -> Sheet:
    """A sheet for one OOD set: a row per method, its most ID-looking OOD images left to right, each captioned with
    rank, score and the percent of ID test scores below it; the true set and the class the classifier predicted
    (`pred`, where the scores table has it); its species (only where rows have one) and file name. `rows` is
    `id_looking_table` for that set, with a `path` column."""
    has_pred = "pred" in rows.columns and rows["pred"].notna().any()
    has_species = "species" in rows.columns and rows["species"].notna().any()
    out = []
    for method, part in rows.groupby("method", sort=False):
        tiles = []
        for _, r in part.sort_values("rank").iterrows():
            seen = (f"{short(set_label(ood_set), 9)} → {short(str(r['pred']), 9)}" if has_pred and pd.notna(r["pred"])
                    else short(set_label(ood_set), 19))
            species = [short(str(r["species"]), 19)] if has_species and pd.notna(r["species"]) else []
            lines = (f"#{int(r['rank'])} {r['score']:.3g} ({r['id_share']:.0f}%)", seen, *species,
                     short(Path(str(r["file_name"])).name, 19))
            tiles.append(Tile(str(r["path"]), lines))
        out.append((method_label(method, paper), tiles))
    parts = ["rank, score (% of ID test scores below)", "true set → predicted class" if has_pred else "true set",
             *(["species"] if has_species else []), "file"]
    return sheet_figure(out, f"{set_label(ood_set)}{note}: most ID-looking OOD images ({'; '.join(parts)})")


def field_sheet(rows: pd.DataFrame, title: str) -> Sheet:
    """Open-Insects Figure 3: a field set's novel-species images, a row per species, each framed red and captioned
    `flagged` when its score is below the transferred threshold, grey and `missed` otherwise. `rows`: columns
    `species, path, file_name, score, flagged`."""
    out = []
    for species, part in rows.groupby("species", sort=False):
        tiles = [Tile(str(r["path"]), ("flagged" if r["flagged"] else "missed", short(Path(str(r["file_name"])).name)),
                      COLORS[1] if r["flagged"] else "#b0b0b0") for _, r in part.iterrows()]
        out.append((short(str(species), 28), tiles))
    return sheet_figure(out, title)



__all__ = ["ROBUST", "ROC_POINTS", "HARD", "EASY", "GROUP_STYLES", "GROUP_OFFSET", "MODEL_LABELS", "ScoreAxis", "Panel",
           "Curve", "Tile", "TILE", "Sheet", "safe_name", "model_label", "robust_limits", "roc_points", "kde",
           "thumbnail", "short",
           "heatmap_figure", "roc_figure", "densities_figure", "best_densities_figure", "fpr95_figure",
           "fewshot_figure", "feature_maps_figure", "auroc_distribution_figure", "sheet_figure", "id_looking_sheet",
           "field_sheet"]
