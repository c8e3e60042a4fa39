"""Results table -> benchmark report: per-set and family tables (markdown, LaTeX, CSV), score-density and FPR@95 plots,
threshold-transfer table and a compact markdown summary.

Input is the runner's results table (DESIGN.md "Results table"): one row per (method, ood_set) with `method, family,
ood_set, group, auroc, fpr95, aupr_in, aupr_out, n_id, n_ood, seconds` (extra columns are kept but not rendered).
Metrics may be fractions or percent: when every metric value is <= 1 they are read as fractions; everything rendered or
written here is in percent.

Ordering (stable, independent of the metric values): families in `FAMILY_ORDER`, then unknown families in order of first
appearance; methods within a family, and OOD sets within a group, in order of first appearance in the table; groups in
`GROUP_ORDER`, then unknown groups in order of first appearance; a set without a group falls in group `GROUP_MISSING`.

Averages are plain means and strict: a method lacking one of the sets an average covers gets no value (rendered "–"),
so that averages over different sets are never compared.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from pipelines.io import atomic_path, atomic_write_text

REQUIRED_COLUMNS = ("method", "family", "ood_set", "group", "auroc", "fpr95", "aupr_in", "aupr_out", "n_id", "n_ood", "seconds")
METRIC_COLUMNS = ("auroc", "fpr95", "fpr95_id", "aupr_in", "aupr_out")
CELL_METRICS = ("fpr95", "auroc")
LOWER_IS_BETTER = {"fpr95": True, "fpr95_id": True, "auroc": False, "aupr_in": False, "aupr_out": False}
METRIC_LABELS = {"fpr95": "FPR@95", "auroc": "AUROC"}
FAMILY_ORDER = ("posthoc", "training", "generative", "clip")
GROUP_ORDER = ("hard", "easy", "near", "far")
GROUP_MISSING = "other"
ALL = "all"
AVERAGE = "average"
SCORE_COLUMNS = ("method", "family", "role", "ood_set", "group", "index", "score")
TRANSFER_COLUMNS = ("method", "source", "target", "threshold", "precision", "recall", "id_kept", "tp", "fp", "n_id", "n_ood")
TRANSFER_RATES = ("tpr", "precision", "recall", "id_kept", "species_detected")
MISSING = "–"


# -- reading ----------------------------------------------------------------------------------------------------------
def read_table(source: pd.DataFrame | str | os.PathLike, required: Sequence[str], what: str) -> pd.DataFrame:
    """A DataFrame from a frame, a .csv or a .parquet file, checked for the `required` columns."""
    if isinstance(source, pd.DataFrame):
        frame, where = source.copy(), what
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{what} {path} not found")
        if path.suffix.lower() == ".parquet":
            frame = pd.read_parquet(path)
        elif path.suffix.lower() == ".csv":
            frame = pd.read_csv(path)
        else:
            raise ValueError(f"{what} {path}: expected a .csv or .parquet file")
        where = f"{what} {path}"
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(f"{where} lacks column(s) {missing}; it has {list(frame.columns)}")
    return frame


def metric_scale(frame: pd.DataFrame, columns: Iterable[str]) -> str:
    """'fraction' when every value of the metric `columns` present is <= 1, else 'percent'."""
    values = np.concatenate([pd.to_numeric(frame[c], errors="coerce").to_numpy(np.float64) for c in columns if c in frame.columns])
    values = values[np.isfinite(values)]
    return "fraction" if values.size == 0 or values.max() <= 1.0 else "percent"


def to_percent(frame: pd.DataFrame, columns: Iterable[str]) -> tuple[pd.DataFrame, str]:
    """`frame` with the metric `columns` in percent, and the input scale ('fraction' or 'percent')."""
    columns = [c for c in columns if c in frame.columns]
    scale = metric_scale(frame, columns)
    out = frame.copy()
    for c in columns:
        values = pd.to_numeric(out[c], errors="coerce").astype(np.float64)
        out[c] = values * 100.0 if scale == "fraction" else values
        bad = out[c].notna() & ((out[c] < 0) | (out[c] > 100))
        if bad.any():
            raise ValueError(f"column {c!r} has value(s) outside [0, 100] percent at row(s) {list(out.index[bad])[:5]}")
    return out, scale


def _group_labels(groups: pd.Series) -> pd.Series:
    """Group names as strings; null or empty -> `GROUP_MISSING`."""
    labels = groups.astype(object).where(groups.notna(), "").astype(str).str.strip()
    return labels.where(labels != "", GROUP_MISSING)


def read_results(source: pd.DataFrame | str | os.PathLike) -> tuple[pd.DataFrame, str]:
    """The results table with metrics in percent and cleaned labels, and the input scale ('fraction' or 'percent').

    Raises on missing columns, missing metric values, duplicate (method, ood_set) rows, a method with two families
    or a set with two groups.
    """
    frame = read_table(source, REQUIRED_COLUMNS, "results table")
    for c in ("method", "family", "ood_set"):
        if frame[c].isna().any():
            raise ValueError(f"results table: column {c!r} is empty at row(s) {list(frame.index[frame[c].isna()])[:5]}")
        frame[c] = frame[c].astype(str)
    frame["group"] = _group_labels(frame["group"])
    for c in CELL_METRICS:
        empty = pd.to_numeric(frame[c], errors="coerce").isna()
        if empty.any():
            raise ValueError(f"results table: column {c!r} has no number at row(s) {list(frame.index[empty])[:5]}")
    duplicated = frame.duplicated(["method", "ood_set"], keep=False)
    if duplicated.any():
        pairs = sorted(set(zip(frame.loc[duplicated, "method"], frame.loc[duplicated, "ood_set"])))
        raise ValueError(f"results table: several rows for (method, ood_set) {pairs[:5]}")
    for key, value in (("method", "family"), ("ood_set", "group")):
        counts = frame.groupby(key)[value].nunique()
        if (counts > 1).any():
            raise ValueError(f"results table: {key} {list(counts.index[counts > 1])} with more than one {value}")
    reserved_groups = sorted({ALL, AVERAGE} & set(frame["group"]))
    if reserved_groups:
        raise ValueError(f"results table: group name(s) {reserved_groups} are reserved for the family averages")
    reserved = {f"{g} avg" for g in frame["group"]} | {f"{ALL} avg"}
    clash = sorted(reserved & set(frame["ood_set"]))
    if clash:
        raise ValueError(f"results table: ood_set name(s) {clash} clash with the average columns")
    return to_percent(frame, METRIC_COLUMNS)


def select_methods(results: pd.DataFrame, methods: Sequence[str] | None) -> pd.DataFrame:
    """Rows of the given `methods` (all when None); unknown names raise an error listing the available ones."""
    if not methods:
        return results
    known = list(dict.fromkeys(results["method"]))
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown} in --methods; the results table has {known}")
    return results[results["method"].isin(methods)]


# -- layout and aggregation -------------------------------------------------------------------------------------------
def _ordered(values: Iterable[str], preferred: Sequence[str]) -> list[str]:
    seen = list(dict.fromkeys(values))
    return [v for v in preferred if v in seen] + [v for v in seen if v not in preferred]


@dataclass(frozen=True)
class Layout:
    """Row and column order of a report: families -> methods, groups -> OOD sets."""

    families: dict[str, list[str]]
    groups: dict[str, list[str]]

    @classmethod
    def of(cls, results: pd.DataFrame) -> "Layout":
        families = {f: list(dict.fromkeys(results.loc[results["family"] == f, "method"])) for f in _ordered(results["family"], FAMILY_ORDER)}
        groups = {g: list(dict.fromkeys(results.loc[results["group"] == g, "ood_set"])) for g in _ordered(results["group"], GROUP_ORDER)}
        return cls(families, groups)

    @property
    def rows(self) -> list[tuple[str, str]]:
        return [(f, m) for f, methods in self.families.items() for m in methods]

    @property
    def sets(self) -> list[str]:
        return [s for sets in self.groups.values() for s in sets]

    @property
    def average_columns(self) -> dict[str, list[str]]:
        """Average column name -> the sets it averages: one per group, then all sets."""
        return {**{f"{g} avg": sets for g, sets in self.groups.items()}, f"{ALL} avg": self.sets}


def per_set_table(results: pd.DataFrame, metrics: Sequence[str] = CELL_METRICS, averages: bool = True) -> pd.DataFrame:
    """Methods x (sets, group averages, overall average) in percent, from a table read by `read_results`.

    Index: (family, method) in layout order. Columns: (column, metric) with column = each OOD set grouped by group,
    then (with `averages`) `"<group> avg"` per group, then `"all avg"`; an average is the plain mean of the method's
    per-set values over the sets it covers, NaN when the method lacks one of them. Without `averages` this is the
    layout of ShiftedBronzes' Table 3.
    """
    layout = Layout.of(results)
    pivot = results.pivot(index="method", columns="ood_set", values=list(metrics))
    methods = [m for _, m in layout.rows]
    pieces = {}
    for metric in metrics:
        values = pivot[metric].reindex(index=methods, columns=layout.sets).astype(np.float64)
        for s in layout.sets:
            pieces[(s, metric)] = values[s]
        for name, sets in layout.average_columns.items():
            pieces[(name, metric)] = values[sets].mean(axis=1, skipna=False)
    columns = [(c, m) for c in [*layout.sets, *(layout.average_columns if averages else [])] for m in metrics]
    table = pd.DataFrame({c: pieces[c] for c in columns})
    table.columns = pd.MultiIndex.from_tuples(columns, names=["column", "metric"])
    table.index = pd.MultiIndex.from_tuples(layout.rows, names=["family", "method"])
    return table


def family_table(results: pd.DataFrame) -> pd.DataFrame:
    """Family averages as in ShiftedBronzes' family table: columns `family, group, fpr95, auroc` (percent).

    For a method m and a group g, v(m, g) is the mean of m's per-set values over g's sets; the family row (f, g) is the
    mean of v(m, g) over f's methods. Group `all` does the same over all sets; group `average` is the mean of the
    family's per-group rows (so `average` weighs groups equally while `all` weighs sets equally). Rows per family:
    `all`, each group in layout order, `average`. A method lacking a set of a group leaves that group NaN.
    """
    layout = Layout.of(results)
    table = per_set_table(results)
    rows = []
    for family in layout.families:
        members = table.xs(family, level="family")
        per_group = {g: members[f"{g} avg"].mean(axis=0, skipna=False) for g in layout.groups}
        rows.append({"family": family, "group": ALL, **members[f"{ALL} avg"].mean(axis=0, skipna=False).to_dict()})
        rows += [{"family": family, "group": g, **v.to_dict()} for g, v in per_group.items()]
        average = pd.DataFrame(per_group).mean(axis=1, skipna=False)
        rows.append({"family": family, "group": AVERAGE, **average.to_dict()})
    return pd.DataFrame(rows, columns=["family", "group", *CELL_METRICS])


def method_summary(results: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean FPR@95 and AUROC over all sets and per group (percent), index (family, method)."""
    table = per_set_table(results)
    layout = Layout.of(results)
    return table[[c for c in layout.average_columns]]


def family_group_table(results: pd.DataFrame) -> pd.DataFrame:
    """ShiftedBronzes' Table 4: index family, columns (group, metric) for each group in layout order, then `all`.

    The values of `family_table` in wide form: per family, the mean over its methods of each method's mean per-set
    value over the group's sets (plain means; NaN when a method lacks one of the sets).
    """
    layout = Layout.of(results)
    long = family_table(results).set_index(["family", "group"])
    columns = [(g, m) for g in [*layout.groups, ALL] for m in CELL_METRICS]
    table = pd.DataFrame({(g, m): [long.loc[(f, g), m] for f in layout.families] for g, m in columns},
                         index=pd.Index(list(layout.families), name="family"))
    table.columns = pd.MultiIndex.from_tuples(columns, names=["column", "metric"])
    return table


def best_rule_table(results: pd.DataFrame, on: str = "local") -> pd.DataFrame:
    """Per training method (`base`), the post-hoc rule with the best AUROC on OOD set `on`, and that rule's values on
    every set (the Open-Insects protocol: a rule is chosen once per base, then reported everywhere).

    Needs the optional results columns `base` and `rule` (rows without a base are ignored). Index: (base, rule,
    method) in order of first appearance of the base; columns (set, metric) as `per_set_table(averages=False)`.
    Ties keep the rule that appears first; a rule without a row for `on` cannot be chosen.
    """
    missing = [c for c in ("base", "rule") if c not in results.columns]
    if missing:
        raise ValueError(f"best-rule table: the results table lacks column(s) {missing} (the training method and the "
                         "post-hoc rule of each row)")
    rows = results[results["base"].notna() & (results["base"].astype(str).str.strip() != "")].copy()
    if rows.empty:
        raise ValueError("best-rule table: no row has a `base` (training method)")
    for c in ("base", "rule"):
        rows[c] = rows[c].astype(str)
    if on not in set(rows["ood_set"]):
        raise ValueError(f"best-rule table: OOD set {on!r} is not in the results; it has {sorted(set(rows['ood_set']))}")
    methods = rows.groupby("method")[["base", "rule"]].nunique()
    if (methods > 1).any(axis=None):
        raise ValueError(f"best-rule table: method(s) {list(methods.index[(methods > 1).any(axis=1)])} with several base/rule values")
    table = per_set_table(rows, averages=False).droplevel("family")
    picked = []
    for base in dict.fromkeys(rows["base"]):
        chosen = rows[(rows["base"] == base) & (rows["ood_set"] == on)]
        if chosen.empty:
            raise ValueError(f"best-rule table: base {base!r} has no result on {on!r}")
        best = chosen.loc[chosen["auroc"].astype(np.float64).idxmax()]
        picked.append((base, best["rule"], best["method"]))
    out = table.loc[[m for _, _, m in picked]]
    out.index = pd.MultiIndex.from_tuples(picked, names=["base", "rule", "method"])
    return out


def rank_marks(values: pd.Series, lower_is_better: bool) -> pd.Series:
    """1 for the best, 2 for the second-best value, 0 otherwise (values compared as rendered, two decimals; ties share)."""
    rounded = values.round(2)
    distinct = np.unique(rounded.dropna().to_numpy())
    distinct = distinct if lower_is_better else distinct[::-1]
    marks = pd.Series(0, index=values.index)
    for rank, value in enumerate(distinct[:2], start=1):
        marks[rounded == value] = rank
    return marks


# -- rendering --------------------------------------------------------------------------------------------------------
def _number(value: float) -> str:
    return MISSING if value is None or not math.isfinite(value) else f"{value:.2f}"


def _scale_note(scale: str) -> str:
    return "Input metrics were fractions, converted to percent." if scale == "fraction" else "Input metrics were in percent."


def _cells(table: pd.DataFrame, bold: str, second: str) -> pd.DataFrame:
    """'FPR@95 / AUROC' strings with best/second-best marks per column and metric; `bold`/`second` are format strings."""
    columns = list(dict.fromkeys(table.columns.get_level_values("column")))
    out = pd.DataFrame(index=table.index, columns=columns, dtype=object)
    for column in columns:
        parts = []
        for metric in CELL_METRICS:
            values = table[(column, metric)]
            marks = rank_marks(values, LOWER_IS_BETTER[metric])
            styles = {0: "{}", 1: bold, 2: second}
            parts.append([styles[k].format(_number(v)) for v, k in zip(values, marks)])
        out[column] = [" / ".join(p) for p in zip(*parts)]
    return out


def _column_label(column: str, layout: Layout) -> str:
    group = next((g for g, sets in layout.groups.items() if column in sets), None)
    return f"{column} ({group})" if group is not None else column


def render_per_set_markdown(table: pd.DataFrame, layout: Layout, scale: str) -> str:
    """The per-set table in markdown: **bold** best, _italics_ second best, per column and metric."""
    cells = _cells(table, "**{}**", "_{}_")
    header = ["Family", "Method", *[_column_label(c, layout) for c in cells.columns]]
    lines = [
        f"Cells: FPR@95 (lower is better) / AUROC (higher is better), in percent. {_scale_note(scale)} "
        "**Bold**: best, _italics_: second best, per column and metric.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join([":--", ":--"] + [":-:"] * len(cells.columns)) + "|",
    ]
    previous = None
    for (family, method), row in cells.iterrows():
        lines.append("| " + " | ".join([family if family != previous else "", method, *row]) + " |")
        previous = family
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
                  "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    """`text` with LaTeX's special characters escaped."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def render_per_set_latex(table: pd.DataFrame, layout: Layout, scale: str) -> str:
    """The per-set table as a booktabs `tabular`: \\textbf best, \\underline second best, per column and metric."""
    cells = _cells(table, r"\textbf{{{}}}", r"\underline{{{}}}")
    averages = [c for c in layout.average_columns if c in cells.columns]
    spans = [(g, len(sets)) for g, sets in layout.groups.items()] + ([("Average", len(averages))] if averages else [])
    lines = [
        f"% FPR@95 (lower is better) / AUROC (higher is better), in percent. {_scale_note(scale)}",
        "% Needs \\usepackage{booktabs}.",
        "\\begin{tabular}{ll" + "c" * len(cells.columns) + "}",
        "\\toprule",
        " & & " + " & ".join(f"\\multicolumn{{{n}}}{{c}}{{{latex_escape(g)}}}" for g, n in spans) + " \\\\",
    ]
    start, rules = 3, []
    for _, n in spans:
        rules.append(f"\\cmidrule(lr){{{start}-{start + n - 1}}}")
        start += n
    lines.append(" ".join(rules))
    labels = layout.sets + [c.removesuffix(" avg") for c in averages]
    lines.append("Family & Method & " + " & ".join(latex_escape(c) for c in labels) + " \\\\")
    previous = None
    for (family, method), row in cells.iterrows():
        if family != previous:
            lines.append("\\midrule")
        first = latex_escape(family) if family != previous else ""
        lines.append(" & ".join([first, latex_escape(method), *row]) + " \\\\")
        previous = family
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def per_set_csv(table: pd.DataFrame) -> pd.DataFrame:
    """The per-set table flat for CSV: `family, method`, then `<column>/<metric>` in percent, full precision."""
    return grid_csv(table)


def markdown_table(frame: pd.DataFrame, formats: dict[str, str] | None = None) -> str:
    """A plain markdown table of `frame`'s columns; numbers use `formats[column]` (default two decimals), NaN -> '–'."""
    formats = formats or {}

    def cell(column: str, value: Any) -> str:
        if isinstance(value, (float, np.floating)):
            return MISSING if not math.isfinite(value) else format(value, formats.get(column, ".2f"))
        return MISSING if value is None or value is pd.NA else str(value)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "|".join(["---"] * len(frame.columns)) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(c, v) for c, v in zip(frame.columns, row)) + " |")
    return "\n".join(lines) + "\n"


def render_families_markdown(families: pd.DataFrame, scale: str) -> str:
    """The family table (`family_table`) in markdown, two decimals."""
    note = f"Family means (plain means over methods of per-set values), in percent. {_scale_note(scale)}\n\n"
    return note + markdown_table(families)


def render_grid_markdown(table: pd.DataFrame, labels: Sequence[str], note: str) -> str:
    """A (column, metric) table with 'FPR@95 / AUROC' cells in markdown; `labels` name the index levels."""
    cells = _cells(table, "**{}**", "_{}_")
    lines = [note, "", "| " + " | ".join([*labels, *cells.columns]) + " |",
             "|" + "|".join([":--"] * len(labels) + [":-:"] * len(cells.columns)) + "|"]
    for key, row in cells.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        lines.append("| " + " | ".join([*map(str, key), *row]) + " |")
    return "\n".join(lines) + "\n"


def render_grid_latex(table: pd.DataFrame, labels: Sequence[str], note: str) -> str:
    """The same as a booktabs `tabular` (\\textbf best, \\underline second best per column and metric)."""
    cells = _cells(table, r"\textbf{{{}}}", r"\underline{{{}}}")
    lines = [f"% {note}", "% Needs \\usepackage{booktabs}.", "\\begin{tabular}{" + "l" * len(labels) + "c" * len(cells.columns) + "}",
             "\\toprule", " & ".join([*map(latex_escape, labels), *map(latex_escape, cells.columns)]) + " \\\\", "\\midrule"]
    for key, row in cells.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        lines.append(" & ".join([*(latex_escape(k) for k in key), *row]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def grid_csv(table: pd.DataFrame) -> pd.DataFrame:
    """A (column, metric) table flat for CSV: the index levels, then `<column>/<metric>`, full precision."""
    flat = table.copy()
    flat.columns = [f"{c}/{m}" for c, m in table.columns]
    return flat.reset_index()


def render_summary(results: pd.DataFrame | str | os.PathLike, methods: Sequence[str] | None = None) -> str:
    """Compact markdown: per method, mean 'FPR@95 / AUROC' over all sets and per group (percent, two decimals).

    `results` is the results table as the runner wrote it (fractions or percent), a frame or a file.
    """
    results, scale = read_results(results)
    results = select_methods(results, methods)
    layout = Layout.of(results)
    summary = method_summary(results)
    columns = [f"{ALL} avg", *[f"{g} avg" for g in layout.groups]]
    lines = [
        f"Mean FPR@95 / AUROC in percent over {len(layout.sets)} OOD set(s). {_scale_note(scale)}",
        "",
        "| Method | Family | " + " | ".join(c.removesuffix(" avg") for c in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for (family, method), row in summary.iterrows():
        cells = [f"{_number(row[(c, 'fpr95')])} / {_number(row[(c, 'auroc')])}" for c in columns]
        lines.append(f"| {method} | {family} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_threshold_transfer(transfer: pd.DataFrame | str | os.PathLike) -> str:
    """The threshold-transfer table in markdown; rates (tpr, precision, recall, id_kept, species_detected) in percent.

    Columns: `method, source, target, [tpr], threshold, precision, recall, id_kept, tp, fp, n_id, n_ood,
    [species_detected]` (the fraction of the target's species with at least one image flagged OOD).
    """
    frame = read_table(transfer, TRANSFER_COLUMNS, "threshold-transfer table")
    frame, scale = to_percent(frame, TRANSFER_RATES)
    columns = [*TRANSFER_COLUMNS[:3], "tpr", *TRANSFER_COLUMNS[3:], "species_detected"]
    frame = frame[[c for c in columns if c in frame.columns]]
    for c in ("tp", "fp", "n_id", "n_ood"):
        frame[c] = frame[c].astype("Int64").astype(object)
    note = ("Threshold chosen on `source` (flag OOD iff score < threshold), precision / recall of OOD and ID kept on "
            f"`target`, rates in percent. {_scale_note(scale)}\n\n")
    return note + markdown_table(frame, {"threshold": ".4g"})


# -- plots ------------------------------------------------------------------------------------------------------------
def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "unnamed"


def _save_figure(figure: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    return path


def read_scores(source: pd.DataFrame | str | os.PathLike) -> pd.DataFrame:
    """The runner's per-sample scores table (`method, family, role, ood_set, group, index, score`)."""
    frame = read_table(source, SCORE_COLUMNS, "scores table")
    roles = set(frame["role"].astype(str)) - {"id", "ood"}
    if roles:
        raise ValueError(f"scores table: column 'role' must be 'id' or 'ood', found {sorted(roles)}")
    frame["group"] = _group_labels(frame["group"])
    frame["method"] = frame["method"].astype(str)
    return frame


def plot_score_densities(scores: pd.DataFrame | str | os.PathLike, out_dir: str | os.PathLike,
                         methods: Sequence[str] | None = None, bins: int = 50) -> list[Path]:
    """One PNG per method, `score_density_<method>.png`: normalised histograms of ID scores and of each OOD group's."""
    from matplotlib.figure import Figure

    scores = read_scores(scores)
    available = list(dict.fromkeys(scores["method"]))
    methods = list(methods) if methods else available
    unknown = [m for m in methods if m not in available]
    if unknown:
        raise ValueError(f"scores table has no method(s) {unknown}; it has {available}")
    paths = []
    for method in methods:
        rows = scores[scores["method"] == method]
        values = rows["score"].to_numpy(np.float64)
        edges = np.histogram_bin_edges(values[np.isfinite(values)], bins=bins)
        figure = Figure(figsize=(6, 3.6))
        axes = figure.add_subplot()
        ood = rows[rows["role"] == "ood"]
        parts = [("ID", rows[rows["role"] == "id"])] + [(f"OOD {g}", ood[ood["group"] == g]) for g in _ordered(ood["group"], GROUP_ORDER)]
        for label, part in parts:
            axes.hist(part["score"].to_numpy(np.float64), bins=edges, density=True, histtype="stepfilled", alpha=0.35,
                      label=f"{label} (n={len(part)})")
        axes.set(xlabel="score (higher = more in-distribution)", ylabel="density", title=f"{method}: score densities")
        axes.legend(fontsize="small")
        paths.append(_save_figure(figure, Path(out_dir) / f"score_density_{_safe_name(method)}.png"))
    return paths


def plot_fpr95(results: pd.DataFrame, path: str | os.PathLike) -> Path:
    """FPR@95 per method (a dot per group mean and per all-set mean) with the means over methods as horizontal lines."""
    from matplotlib.figure import Figure

    layout = Layout.of(results)
    summary = method_summary(results)
    labels = [m for _, m in layout.rows]
    x = np.arange(len(labels))
    figure = Figure(figsize=(max(5.0, 0.6 * len(labels) + 2), 4))
    axes = figure.add_subplot()
    colors = {name: f"C{i}" for i, name in enumerate([*layout.groups, ALL])}
    for name, color in colors.items():
        values = summary[(f"{name} avg", "fpr95")].to_numpy(np.float64)
        axes.plot(x, values, "o", color=color, label=f"{name}")
        axes.axhline(np.nanmean(values) if np.isfinite(values).any() else np.nan, color=color, linestyle="--",
                     linewidth=1, label=f"{name} mean")
    axes.set_xticks(x, labels, rotation=45, ha="right")
    axes.set(ylabel="FPR@95 (%)", title="FPR@95 per method (lower is better)")
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save_figure(figure, Path(path))


# -- the whole report -------------------------------------------------------------------------------------------------
def companion_files(results_path: str | os.PathLike) -> dict[str, Path]:
    """Files the runner writes beside the results table and that exist: `scores` (scores.parquet), `threshold_transfer`."""
    folder = Path(results_path).parent
    found = {"scores": folder / "scores.parquet", "threshold_transfer": folder / "threshold_transfer.csv"}
    return {k: p for k, p in found.items() if p.is_file()}


def write_report(results: pd.DataFrame | str | os.PathLike, out_dir: str | os.PathLike, *,
                 methods: Sequence[str] | None = None, scores: pd.DataFrame | str | os.PathLike | None = None,
                 threshold_transfer: pd.DataFrame | str | os.PathLike | None = None,
                 best_rule_on: str = "local") -> list[Path]:
    """Write every table and plot of the report under `out_dir`; returns the paths written.

    per_set.{md,tex,csv}, table3.{md,tex,csv} (per set, no averages), table4.{md,tex,csv} (family x group),
    families.{md,csv}, fpr95_by_method.png, score_density_<method>.png (with `scores`), threshold_transfer.md (with
    `threshold_transfer`), best_rule.{md,tex,csv} (when the table has `base` / `rule` columns and the set
    `best_rule_on`). `methods` restricts the report to those methods.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame, scale = read_results(results)
    frame = select_methods(frame, methods)
    layout = Layout.of(frame)
    table = per_set_table(frame)
    families = family_table(frame)
    table3 = per_set_table(frame, averages=False)
    table4 = family_group_table(frame)
    note3 = f"FPR@95 (lower is better) / AUROC (higher is better) per OOD set, in percent. {_scale_note(scale)}"
    note4 = (f"Family means (plain means over methods of per-set values), FPR@95 / AUROC in percent. "
             f"{_scale_note(scale)}")
    texts = {
        "per_set.md": render_per_set_markdown(table, layout, scale),
        "per_set.tex": render_per_set_latex(table, layout, scale),
        "per_set.csv": per_set_csv(table).to_csv(index=False),
        "table3.md": render_per_set_markdown(table3, layout, scale),
        "table3.tex": render_per_set_latex(table3, layout, scale),
        "table3.csv": per_set_csv(table3).to_csv(index=False),
        "table4.md": render_grid_markdown(table4, ["Family"], note4),
        "table4.tex": render_grid_latex(table4, ["Family"], note4),
        "table4.csv": grid_csv(table4).to_csv(index=False),
        "families.md": render_families_markdown(families, scale),
        "families.csv": families.to_csv(index=False),
    }
    has_base = "base" in frame.columns and (frame["base"].fillna("").astype(str).str.strip() != "").any()
    if has_base and "rule" in frame.columns and best_rule_on in set(frame["ood_set"]):
        best = best_rule_table(frame, best_rule_on)
        note = (f"Per training method, the post-hoc rule with the best AUROC on `{best_rule_on}`, reported on every "
                f"set: FPR@95 / AUROC in percent. {_scale_note(scale)}")
        texts.update({"best_rule.md": render_grid_markdown(best, ["Base", "Rule", "Method"], note),
                      "best_rule.tex": render_grid_latex(best, ["Base", "Rule", "Method"], note),
                      "best_rule.csv": grid_csv(best).to_csv(index=False)})
    if threshold_transfer is not None:
        transfer = read_table(threshold_transfer, TRANSFER_COLUMNS, "threshold-transfer table")
        if methods:
            transfer = transfer[transfer["method"].astype(str).isin(methods)]
        texts["threshold_transfer.md"] = render_threshold_transfer(transfer)
    written = []
    for name, text in texts.items():
        atomic_write_text(out / name, text)
        written.append(out / name)
    written.append(plot_fpr95(frame, out / "fpr95_by_method.png"))
    if scores is not None:
        written += plot_score_densities(scores, out, methods=[m for _, m in layout.rows] if methods else None)
    return written
