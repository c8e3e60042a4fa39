"""The report's figures (matplotlib's object API, no pyplot state): AUROC / FPR@95 heatmaps, ROC curves per set, score
densities per method with one panel per set, FPR@95 by method grouped by family (ShiftedBronzes Figure 5), and
thumbnail sheets of the most ID-looking OOD images."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from detectors.report.scores import per_set_auroc
from detectors.report.tables import ALL, LOW_AUROC, Layout, method_summary
from detectors.tables import COLUMN_LABELS
from pipelines.io import atomic_path, safe_name

DPI = 120
ROBUST = (0.5, 99.5)
"""Percentiles of a method's pooled scores that bound its density plots' x axis (heavy tails, e.g. GRAM, would
otherwise squeeze every histogram into one bin)."""


def save_figure(figure: Any, path: str | os.PathLike) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    return path


def new_figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


# -- heatmap ----------------------------------------------------------------------------------------------------------
def _separators(axes: Any, layout: Layout) -> None:
    """Lines between families (rows) and groups (columns), family names at the right, group names on top."""
    row = 0
    for family, methods in layout.families.items():
        axes.text(1.01, row + (len(methods) - 1) / 2, family, transform=axes.get_yaxis_transform(), va="center",
                  fontsize="small", fontweight="bold")
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


def plot_heatmap(table: pd.DataFrame, layout: Layout, metric: str, path: str | os.PathLike) -> Path:
    """Methods (grouped by family) x OOD sets (grouped by group) coloured by `metric` ('auroc' or 'fpr95', percent),
    each cell annotated; AUROC below 50 is marked with a dagger. `table` is `per_set_table(averages=False)`."""
    values = np.array([[table.loc[(f, m), (s, metric)] for s in layout.sets] for f, m in layout.rows], dtype=np.float64)
    figure = new_figure(2.8 + 0.75 * len(layout.sets), 1.4 + 0.32 * len(layout.rows))
    axes = figure.add_subplot()
    cmap = "RdYlGn" if metric == "auroc" else "RdYlGn_r"
    image = axes.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=100, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            flag = "†" if metric == "auroc" and v < LOW_AUROC else ""
            axes.text(j, i, f"{v:.1f}{flag}", ha="center", va="center", fontsize="x-small",
                      color="white" if (v < 20 or v > 85) else "black", fontweight="bold" if flag else "normal")
    axes.set_xticks(range(len(layout.sets)), layout.sets, rotation=40, ha="right")
    axes.set_yticks(range(len(layout.rows)), layout.methods)
    _separators(axes, layout)
    label = COLUMN_LABELS[metric]
    figure.colorbar(image, ax=axes, label=f"{label} (%)", shrink=0.8, pad=0.12)
    better = "lower" if metric == "fpr95" else "higher"
    flag_note = f"; † AUROC < {LOW_AUROC:.0f}" if metric == "auroc" else ""
    axes.set_title(f"{label} per method and OOD set ({better} is better{flag_note})")
    return save_figure(figure, path)


# -- ROC curves -------------------------------------------------------------------------------------------------------
def _roc_points(id_scores: np.ndarray, ood_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) with OOD positive, one point per distinct score v (flag OOD iff score <= v), from (0, 0)."""
    values = np.unique(np.r_[id_scores, ood_scores])
    tpr = np.searchsorted(np.sort(ood_scores), values, side="right") / len(ood_scores)
    fpr = np.searchsorted(np.sort(id_scores), values, side="right") / len(id_scores)
    return np.r_[0.0, fpr], np.r_[0.0, tpr]


def plot_roc(scores: pd.DataFrame, ood_set: str, methods: Sequence[str], path: str | os.PathLike) -> Path:
    """ROC curves of every method on one OOD set (OOD = positive), AUROC in the legend."""
    figure = new_figure(7.5, 5.0)
    axes = figure.add_subplot()
    aurocs = per_set_auroc(scores[(scores["role"] == "id") | (scores["ood_set"] == ood_set)])
    styles = ["-", "--", ":", "-."]
    for i, method in enumerate(methods):
        rows = scores[scores["method"] == method]
        id_scores = rows.loc[rows["role"] == "id", "score"].to_numpy(np.float64)
        ood_scores = rows.loc[(rows["role"] == "ood") & (rows["ood_set"] == ood_set), "score"].to_numpy(np.float64)
        if not len(id_scores) or not len(ood_scores):
            continue
        fpr, tpr = _roc_points(id_scores, ood_scores)
        value = aurocs[(method, ood_set)]
        flag = " †" if value < LOW_AUROC else ""
        axes.plot(fpr, tpr, styles[(i // 10) % 4], color=f"C{i % 10}", linewidth=1.4, label=f"{method} ({value:.1f}{flag})")
    axes.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle=":")
    axes.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="ID rejected (FPR)", ylabel="OOD detected (TPR)",
             title=f"ROC on {ood_set} (OOD positive); legend: AUROC %")
    axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), ncols=1 + len(methods) // 25)
    return save_figure(figure, path)


# -- score densities --------------------------------------------------------------------------------------------------
def robust_limits(values: np.ndarray) -> tuple[float, float]:
    """The `ROBUST` percentiles of the finite `values`, widened a little when they coincide."""
    finite = values[np.isfinite(values)]
    lo, hi = np.percentile(finite, ROBUST) if finite.size else (0.0, 1.0)
    if hi <= lo:
        pad = max(abs(lo) * 1e-3, 1e-6)
        lo, hi = lo - pad, hi + pad
    return float(lo), float(hi)


def _panels(rows: pd.DataFrame) -> list[tuple[str, np.ndarray, np.ndarray, tuple[str, str]]]:
    """(set, reference scores, OOD scores, their labels) per test OOD set, then per field set."""
    id_scores = rows.loc[rows["role"] == "id", "score"].to_numpy(np.float64)
    out = [(s, id_scores, p["score"].to_numpy(np.float64), ("ID test", "OOD"))
           for s, p in rows[rows["role"] == "ood"].groupby("ood_set", sort=False)]
    for s, p in rows[rows["role"].isin(["field_id", "field_ood"])].groupby("ood_set", sort=False):
        known, novel = (p.loc[p["role"] == r, "score"].to_numpy(np.float64) for r in ("field_id", "field_ood"))
        if len(novel):
            out.append((f"{s} (field)", known, novel, ("field known", "field novel")))
    return out


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
            ticks = self.inverse(np.linspace(self.forward(self.lo), self.forward(self.hi), 5))
            axes.set_xticks(ticks, [_tick(v, self.hi - self.lo) for v in ticks], fontsize="small")
        label = "score (higher = more ID)" + ("; log distance from the ID median" if self.scale else "")
        axes.set_xlabel(label, fontsize="small")


def _tick(value: float, span: float) -> str:
    if abs(value) < 1e-9 * span:
        return "0"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _hist(axes: Any, values: np.ndarray, edges: np.ndarray, label: str, color: str) -> None:
    """The share of `values` per bin as an outline; values outside the edges count in the total but are not drawn."""
    inside = values[(values >= edges[0]) & (values <= edges[-1])]
    outside = len(values) - len(inside)
    note = f", {outside} outside" if outside else ""
    axes.hist(inside, bins=edges, weights=np.full(len(inside), 1.0 / max(len(values), 1)), histtype="step",
              linewidth=1.6, color=color, label=f"{label} (n={len(values)}{note})")


def plot_method_densities(rows: pd.DataFrame, method: str, path: str | os.PathLike, bins: int = 40) -> Path:
    """One panel per OOD set (and field set): the reference (ID test, or the field set's known rows) and the OOD score
    distributions as outlines (share of each set per bin), AUROC in the panel title, x limits at the `ROBUST`
    percentiles of the method's scores (a log-distance axis when they span far more than the ID scores, `ScoreAxis`)."""
    panels = _panels(rows)
    aurocs = per_set_auroc(rows)
    axis = ScoreAxis.of(rows)
    edges = axis.edges(bins)
    ncols = min(3, max(len(panels), 1))
    nrows = max(1, -(-len(panels) // ncols))
    figure = new_figure(4.2 * ncols, 3.0 * nrows + 0.5)
    for i, (name, reference, ood, labels) in enumerate(panels):
        axes = figure.add_subplot(nrows, ncols, i + 1)
        _hist(axes, reference, edges, labels[0], "black")
        _hist(axes, ood, edges, labels[1], "C3")
        value = aurocs.get((method, name.removesuffix(" (field)")), float("nan"))
        flag = " †" if value < LOW_AUROC else ""
        axes.set_title(f"{name}: AUROC {value:.2f}{flag}", fontsize="medium", color="C3" if flag else "black")
        axis.apply(axes)
        axes.set_ylabel("share per bin", fontsize="small")
        axes.legend(fontsize="x-small")
    figure.suptitle(f"{method}: score distributions (x axis: {ROBUST[0]}-{ROBUST[1]} percentiles of its scores)")
    return save_figure(figure, path)


def plot_score_densities(scores: pd.DataFrame, out_dir: str | os.PathLike, methods: Sequence[str] | None = None,
                         bins: int = 40) -> list[Path]:
    """`score_density_<method>.png` per method (`plot_method_densities`); `scores` as `read_scores` returns it."""
    available = list(dict.fromkeys(scores["method"]))
    methods = list(methods) if methods else available
    unknown = [m for m in methods if m not in available]
    if unknown:
        raise ValueError(f"scores table has no method(s) {unknown}; it has {available}")
    return [plot_method_densities(scores[scores["method"] == m], m, Path(out_dir) / f"score_density_{safe_name(m)}.png",
                                  bins) for m in methods]


# -- FPR@95 by method, grouped by family (ShiftedBronzes Figure 5) ----------------------------------------------------
def _family_positions(layout: Layout) -> tuple[np.ndarray, list[tuple[str, float, float]]]:
    """x of each method (a gap between families) and (family, first x, last x)."""
    xs, spans, x = [], [], 0.0
    for family, methods in layout.families.items():
        spans.append((family, x, x + len(methods) - 1))
        xs += [x + i for i in range(len(methods))]
        x += len(methods) + 1
    return np.array(xs), spans


def plot_fpr95(results: pd.DataFrame, path: str | os.PathLike) -> Path:
    """FPR@95 per method, methods grouped by family: a dot per group mean and per all-set mean, dashed lines at the
    means over all methods of each (the all / hard / easy average lines)."""
    layout = Layout.of(results)
    summary = method_summary(results)
    xs, spans = _family_positions(layout)
    figure = new_figure(max(6.0, 0.45 * len(xs) + 3), 4.5)
    axes = figure.add_subplot()
    names = [ALL, *layout.groups]
    for i, name in enumerate(names):
        values = summary[(f"{name} avg", "fpr95")].to_numpy(np.float64)
        color = "black" if name == ALL else f"C{i - 1}"
        axes.plot(xs, values, "o" if name == ALL else "^", color=color, markersize=5, label=name)
        if np.isfinite(values).any():
            axes.axhline(np.nanmean(values), color=color, linestyle="--", linewidth=1, label=f"{name} mean")
    for family, first, last in spans:
        axes.text((first + last) / 2, 1.02, family, transform=axes.get_xaxis_transform(), ha="center", fontweight="bold")
        if last < xs.max():
            axes.axvline(last + 1, color="grey", linewidth=0.8, linestyle=":")
    axes.set_xticks(xs, layout.methods, rotation=45, ha="right")
    axes.set(ylabel="FPR@95 (%)", ylim=(-3, 103), xlim=(xs.min() - 0.7, xs.max() + 0.7))
    axes.set_title("FPR@95 per method, grouped by family (lower is better)", pad=18)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(figure, path)


# -- thumbnails of the most ID-looking OOD images ---------------------------------------------------------------------
def _thumbnail(path: Any, size: int = 128) -> np.ndarray | None:
    from pipelines.data import ImageLoadError, load_image

    try:
        image = load_image(str(path))
    except (ImageLoadError, OSError):
        return None
    image.thumbnail((size, size))
    return np.asarray(image)


def _short(text: str, n: int = 22) -> str:
    return text if len(text) <= n else text[: n // 2 - 1] + "…" + text[-(n // 2):]


def plot_id_looking(rows: pd.DataFrame, ood_set: str, path: str | os.PathLike) -> Path:
    """A sheet for one OOD set: a row per method, its most ID-looking OOD images left to right (rank, score, and the
    percent of ID test scores below it). `rows` is `id_looking_table` for that set, with a `path` column."""
    methods = list(dict.fromkeys(rows["method"]))
    k = int(rows["rank"].max())
    figure = new_figure(1.0 + 1.5 * k, 0.4 + 1.75 * len(methods))
    grid = figure.subplots(len(methods), k, squeeze=False)
    for i, method in enumerate(methods):
        for j in range(k):
            axes = grid[i, j]
            axes.set_xticks([])
            axes.set_yticks([])
            hit = rows[(rows["method"] == method) & (rows["rank"] == j + 1)]
            if j == 0:
                axes.set_ylabel(method, fontsize="small", rotation=0, ha="right", va="center")
            if hit.empty:
                axes.set_axis_off()
                continue
            row = hit.iloc[0]
            pixels = _thumbnail(row["path"])
            if pixels is None:
                axes.text(0.5, 0.5, "unreadable", ha="center", va="center", fontsize="x-small")
            else:
                axes.imshow(pixels)
            axes.set_title(f"#{j + 1} {row['score']:.3g} ({row['id_share']:.0f}%)", fontsize="x-small")
            axes.set_xlabel(_short(Path(str(row["file_name"])).name), fontsize="xx-small")
    figure.suptitle(f"{ood_set}: most ID-looking OOD images per method (score; % of ID test scores below it)")
    return save_figure(figure, path)


__all__ = ["ROBUST", "ScoreAxis", "safe_name", "save_figure", "new_figure", "plot_heatmap", "plot_roc", "robust_limits", "plot_method_densities",
           "plot_score_densities", "plot_fpr95", "plot_id_looking"]
