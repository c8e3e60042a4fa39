"""The results table read and aggregated: layout, per-set table (Table 3), family means (Table 4), best rule.

Input is the runner's results table (`detectors.harness.results.RESULT_COLUMNS`; tables without the newer optional
columns still read). Metrics may be fractions or percent: when every metric value is <= 1 they are read as fractions;
everything returned here is in percent.

Ordering (stable, independent of the metric values): families in `FAMILY_ORDER`, then unknown families in order of first
appearance; methods within a family, and OOD sets within a group, in order of first appearance in the table; groups in
`GROUP_ORDER`, then unknown groups in order of first appearance; a set without a group falls in group `GROUP_MISSING`.

Averages are plain means and strict: a method lacking one of the sets an average covers gets no value (rendered "–"),
so that averages over different sets are never compared.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from detectors.harness.results import METRICS, RESULT_REQUIRED
from detectors.openset_metrics import OPENSET_RATES
from detectors.registry import FAMILIES
from pipelines.errors import UserInputError
from pipelines.schema import GROUPS

CELL_METRICS = ("fpr95", "auroc")
PERCENT_COLUMNS = (*METRICS, "id_acc", *OPENSET_RATES)
FAMILY_ORDER = FAMILIES
GROUP_ORDER = GROUPS
GROUP_MISSING = "other"
ALL = "all"
AVERAGE = "average"
LOW_AUROC = 50.0
"""AUROC (percent) below which a set is flagged: the detector ranks that OOD set as more in-distribution than ID."""
RULE_SELECTION_COLUMNS = ("base", "rule", "metric", "value", "ood_val", "chosen")
COMPANIONS = {"scores": "scores.parquet", "threshold_transfer": "threshold_transfer.csv",
              "rule_selection": "rule_selection.csv", "fewshot": "fewshot.csv"}
"""The files the runner writes beside the results table."""
NOT_SELECTED = "not selected on validation"


# -- reading ----------------------------------------------------------------------------------------------------------
def companion_files(results_path: str | os.PathLike) -> dict[str, Path]:
    """Files the runner writes beside the results table and that exist: `scores`, `threshold_transfer`,
    `rule_selection`, `fewshot`."""
    folder = Path(results_path).parent
    return {k: folder / name for k, name in COMPANIONS.items() if (folder / name).is_file()}



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
            raise UserInputError(f"{what} {path}: expected a .csv or .parquet file")
        where = f"{what} {path}"
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise UserInputError(f"{where} lacks column(s) {missing}; it has {list(frame.columns)}")
    return frame


def metric_scale(frame: pd.DataFrame, columns: Iterable[str]) -> str:
    """'fraction' when every value of the metric `columns` present is <= 1, else 'percent'."""
    parts = [pd.to_numeric(frame[c], errors="coerce").to_numpy(np.float64) for c in columns if c in frame.columns]
    values = np.concatenate(parts) if parts else np.zeros(0)
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
            raise UserInputError(f"column {c!r} has value(s) outside [0, 100] percent at row(s) "
                                 f"{list(out.index[bad])[:5]}")
    return out, scale


def group_labels(groups: pd.Series) -> pd.Series:
    """Group names as strings; null or empty -> `GROUP_MISSING` (cleaned once per distinct value: scores tables have
    millions of rows and a handful of groups)."""
    codes, uniques = pd.factorize(groups, use_na_sentinel=True)
    names = [str(u).strip() or GROUP_MISSING for u in uniques] + [GROUP_MISSING]
    return pd.Series(np.array(names, dtype=object)[codes], index=groups.index)


def text_column(values: pd.Series) -> pd.Series:
    """Strings with null / NaN as ''."""
    return values.astype(object).where(values.notna(), "").astype(str).str.strip()


def _own_families(frame: pd.DataFrame) -> pd.DataFrame:
    """A row that re-scores a training method (non-empty `base`) is family `training` (older runners labelled the
    rule's own family), so that each family's means cover only its own rows."""
    if "base" not in frame.columns:
        return frame
    frame["base"] = text_column(frame["base"])
    if "rule" in frame.columns:
        frame["rule"] = text_column(frame["rule"])
    frame.loc[frame["base"] != "", "family"] = "training"
    return frame


def _check_results(frame: pd.DataFrame) -> None:
    for c in CELL_METRICS:
        empty = pd.to_numeric(frame[c], errors="coerce").isna()
        if empty.any():
            raise UserInputError(f"results table: column {c!r} has no number at row(s) {list(frame.index[empty])[:5]}")
    duplicated = frame.duplicated(["method", "ood_set"], keep=False)
    if duplicated.any():
        pairs = sorted(set(zip(frame.loc[duplicated, "method"], frame.loc[duplicated, "ood_set"])))
        raise UserInputError(f"results table: several rows for (method, ood_set) {pairs[:5]}")
    for key, value in (("method", "family"), ("ood_set", "group")):
        counts = frame.groupby(key)[value].nunique()
        if (counts > 1).any():
            raise UserInputError(f"results table: {key} {list(counts.index[counts > 1])} with more than one {value}")
    reserved_groups = sorted({ALL, AVERAGE} & set(frame["group"]))
    if reserved_groups:
        raise UserInputError(f"results table: group name(s) {reserved_groups} are reserved for the family averages")
    reserved = {f"{g} avg" for g in frame["group"]} | {f"{ALL} avg"}
    clash = sorted(reserved & set(frame["ood_set"]))
    if clash:
        raise UserInputError(f"results table: ood_set name(s) {clash} clash with the average columns")


def read_results(source: pd.DataFrame | str | os.PathLike) -> tuple[pd.DataFrame, str]:
    """The results table with metrics (and `id_acc`) in percent and cleaned labels, and the input scale.

    Raises on missing columns, missing metric values, duplicate (method, ood_set) rows, a method with two families
    or a set with two groups. Rows with a `base` get family `training`.
    """
    frame = read_table(source, RESULT_REQUIRED, "results table")
    for c in ("method", "family", "ood_set"):
        if frame[c].isna().any():
            raise UserInputError(f"results table: column {c!r} is empty at row(s) "
                                 f"{list(frame.index[frame[c].isna()])[:5]}")
        frame[c] = frame[c].astype(str)
    frame["group"] = group_labels(frame["group"])
    frame = _own_families(frame)
    if "mode" in frame.columns:
        frame["mode"] = text_column(frame["mode"])
    _check_results(frame)
    return to_percent(frame, PERCENT_COLUMNS)


def select_methods(results: pd.DataFrame, methods: Sequence[str] | None) -> pd.DataFrame:
    """Rows of the given `methods` (all when None); unknown names raise an error listing the available ones."""
    if not methods:
        return results
    known = list(dict.fromkeys(results["method"]))
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise UserInputError(f"unknown method(s) {unknown} in --methods; the results table has {known}")
    return results[results["method"].isin(methods)]


# -- layout and aggregation -------------------------------------------------------------------------------------------
def ordered(values: Iterable[str], preferred: Sequence[str]) -> list[str]:
    """Distinct `values`: those in `preferred` first (in its order), then the others in order of first appearance."""
    seen = list(dict.fromkeys(values))
    return [v for v in preferred if v in seen] + [v for v in seen if v not in preferred]


@dataclass(frozen=True)
class Layout:
    """Row and column order of a report: families -> methods, groups -> OOD sets."""

    families: dict[str, list[str]]
    groups: dict[str, list[str]]

    @classmethod
    def of(cls, results: pd.DataFrame, family_order: Sequence[str] = FAMILY_ORDER,
           order: Callable[[Iterable[str]], list[str]] | None = None) -> Layout:
        """The results' layout: families in `family_order` (then others), methods in first appearance or sorted by
        `order` (a paper's, `names.Paper.sorted`), groups in `GROUP_ORDER`, sets in first appearance."""
        sort = order or (lambda methods: list(dict.fromkeys(methods)))
        families = {f: sort(results.loc[results["family"] == f, "method"])
                    for f in ordered(results["family"], family_order)}
        groups = {g: list(dict.fromkeys(results.loc[results["group"] == g, "ood_set"]))
                  for g in ordered(results["group"], GROUP_ORDER)}
        return cls(families, groups)

    @property
    def rows(self) -> list[tuple[str, str]]:
        return [(f, m) for f, methods in self.families.items() for m in methods]

    @property
    def methods(self) -> list[str]:
        return [m for _, m in self.rows]

    @property
    def sets(self) -> list[str]:
        return [s for sets in self.groups.values() for s in sets]

    @property
    def average_columns(self) -> dict[str, list[str]]:
        """Average column name -> the sets it averages: one per group, then all sets."""
        return {**{f"{g} avg": sets for g, sets in self.groups.items()}, f"{ALL} avg": self.sets}

    def group_of(self, ood_set: str) -> str | None:
        return next((g for g, sets in self.groups.items() if ood_set in sets), None)


def per_set_table(results: pd.DataFrame, metrics: Sequence[str] = CELL_METRICS, averages: bool = True,
                  layout: Layout | None = None) -> pd.DataFrame:
    """Methods x (sets, group averages, overall average) in percent, from a table read by `read_results`.

    Index: (family, method) in layout order. Columns: (column, metric) with column = each OOD set grouped by group,
    then (with `averages`) `"<group> avg"` per group, then `"all avg"`; an average is the plain mean of the method's
    per-set values over the sets it covers, NaN when the method lacks one of them. Without `averages` this is the
    layout of ShiftedBronzes' Table 3. `layout` orders the rows and columns (default `Layout.of(results)`).
    """
    layout = layout or Layout.of(results)
    pivot = results.pivot(index="method", columns="ood_set", values=list(metrics))
    pieces = {}
    for metric in metrics:
        values = pivot[metric].reindex(index=layout.methods, columns=layout.sets).astype(np.float64)
        for s in layout.sets:
            pieces[(s, metric)] = values[s]
        for name, sets in layout.average_columns.items():
            pieces[(name, metric)] = values[sets].mean(axis=1, skipna=False)
    columns = [(c, m) for c in [*layout.sets, *(layout.average_columns if averages else [])] for m in metrics]
    table = pd.DataFrame({c: pieces[c] for c in columns})
    table.columns = pd.MultiIndex.from_tuples(columns, names=["column", "metric"])
    table.index = pd.MultiIndex.from_tuples(layout.rows, names=["family", "method"])
    return table


def method_info(results: pd.DataFrame) -> pd.DataFrame:
    """Per method: `id_acc` (percent, NaN when absent) and `mode` ('' when absent), indexed by method."""
    first = results.drop_duplicates("method").set_index("method")
    acc = first["id_acc"] if "id_acc" in first.columns else pd.Series(np.nan, index=first.index)
    mode = first["mode"] if "mode" in first.columns else pd.Series("", index=first.index)
    return pd.DataFrame({"id_acc": acc.astype(np.float64), "mode": mode.astype(str)})


def family_table(results: pd.DataFrame, layout: Layout | None = None,
                 table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Family averages as in ShiftedBronzes' family table: columns `family, group, fpr95, auroc` (percent).

    For a method m and a group g, v(m, g) is the mean of m's per-set values over g's sets; the family row (f, g) is the
    mean of v(m, g) over f's own methods. Group `all` does the same over all sets; group `average` is the mean of the
    family's per-group rows (so `average` weighs groups equally while `all` weighs sets equally). Rows per family:
    `all`, each group in layout order, `average`. A method lacking a set of a group leaves that group NaN. `table`:
    `per_set_table(results, layout=layout)` when already computed.
    """
    layout = layout or Layout.of(results)
    table = per_set_table(results, layout=layout) if table is None else table
    rows = []
    for family in layout.families:
        members = table.xs(family, level="family")
        per_group = {g: members[f"{g} avg"].mean(axis=0, skipna=False) for g in layout.groups}
        rows.append({"family": family, "group": ALL, **members[f"{ALL} avg"].mean(axis=0, skipna=False).to_dict()})
        rows += [{"family": family, "group": g, **v.to_dict()} for g, v in per_group.items()]
        average = pd.DataFrame(per_group).mean(axis=1, skipna=False)
        rows.append({"family": family, "group": AVERAGE, **average.to_dict()})
    return pd.DataFrame(rows, columns=["family", "group", *CELL_METRICS])


def method_summary(results: pd.DataFrame, layout: Layout | None = None) -> pd.DataFrame:
    """Per method: mean FPR@95 and AUROC over all sets and per group (percent), index (family, method)."""
    layout = layout or Layout.of(results)
    return per_set_table(results, layout=layout)[list(layout.average_columns)]


def family_group_table(results: pd.DataFrame, layout: Layout | None = None,
                       families: pd.DataFrame | None = None) -> pd.DataFrame:
    """ShiftedBronzes' Table 4: index family, columns (group, metric) for `all`, then each group in layout order
    (the paper's All | Hard | Easy).

    The values of `family_table` (`families`, when already computed) in wide form: per family, the mean over its methods
    of each method's mean per-set value over the group's sets (plain means; NaN when a method lacks one of the sets).
    """
    layout = layout or Layout.of(results)
    long = (family_table(results, layout) if families is None else families).set_index(["family", "group"])
    columns = [(g, m) for g in [ALL, *layout.groups] for m in CELL_METRICS]
    table = pd.DataFrame({(g, m): [long.loc[(f, g), m] for f in layout.families] for g, m in columns},
                         index=pd.Index(list(layout.families), name="family"))
    table.columns = pd.MultiIndex.from_tuples(columns, names=["column", "metric"])
    return table


def low_auroc(results: pd.DataFrame) -> pd.DataFrame:
    """Rows whose AUROC is below `LOW_AUROC` percent: `method, family, ood_set, group, auroc`, in layout order."""
    layout = Layout.of(results)
    low = results[results["auroc"].astype(np.float64) < LOW_AUROC]
    order = {m: i for i, m in enumerate(layout.methods)}
    sets = {s: i for i, s in enumerate(layout.sets)}
    low = low.assign(_m=low["method"].map(order), _s=low["ood_set"].map(sets)).sort_values(["_m", "_s"])
    return low[["method", "family", "ood_set", "group", "auroc"]].reset_index(drop=True)


def rank_marks(values: pd.Series, lower_is_better: bool) -> pd.Series:
    """1 for the best, 2 for the second-best value, 0 otherwise (values compared as rendered, two decimals; ties
    share)."""
    rounded = values.round(2)
    distinct = np.unique(rounded.dropna().to_numpy())
    distinct = distinct if lower_is_better else distinct[::-1]
    marks = pd.Series(0, index=values.index)
    for rank, value in enumerate(distinct[:2], start=1):
        marks[rounded == value] = rank
    return marks


# -- the best post-hoc rule per training method -----------------------------------------------------------------------
def read_rule_selection(source: pd.DataFrame | str | os.PathLike) -> pd.DataFrame:
    """The runner's `rule_selection.csv` (`base, rule, metric, value, ood_val, chosen`) with `chosen` as bool and
    empty rules as ''. Each base must have exactly one chosen row."""
    frame = read_table(source, RULE_SELECTION_COLUMNS, "rule-selection table")
    frame["base"], frame["rule"] = text_column(frame["base"]), text_column(frame["rule"])
    chosen = frame["chosen"]
    if chosen.dtype != bool:
        chosen = text_column(chosen).str.lower().isin({"true", "1", "yes"})
    frame["chosen"] = chosen
    counts = frame.groupby("base")["chosen"].sum()
    if (counts != 1).any():
        raise UserInputError(f"rule-selection table: base(s) {list(counts.index[counts != 1])} need exactly one chosen "
                             "row")
    return frame


def _rule_rows(results: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in ("base", "rule") if c not in results.columns]
    if missing:
        raise UserInputError(f"best-rule table: the results table lacks column(s) {missing} (the training method and "
                             "the post-hoc rule of each row)")
    rows = results[text_column(results["base"]) != ""].copy()
    if rows.empty:
        raise UserInputError("best-rule table: no row has a `base` (training method)")
    rows["base"], rows["rule"] = text_column(rows["base"]), text_column(rows["rule"])
    methods = rows.groupby("method")[["base", "rule"]].nunique()
    if (methods > 1).any(axis=None):
        raise UserInputError(f"best-rule table: method(s) {list(methods.index[(methods > 1).any(axis=1)])} with "
                             "several base/rule values")
    return rows


def _chosen_label(pick: pd.Series) -> str:
    value = float(pick["value"])
    shown = f"{value * 100:.2f}" if abs(value) <= 1 else f"{value:.2f}"
    return f"validation ({pick['ood_val']}): {pick['metric']} {shown}"


def best_rule_table(results: pd.DataFrame, selection: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per training method (`base`), the post-hoc rule chosen ON VALIDATION and its values on every test set.

    `selection` is the runner's rule-selection table (`read_rule_selection`): its chosen row names each base's rule,
    and the `chosen on` index level says which split and metric chose it. Without it nothing is chosen (a rule is
    never picked on test metrics): every rule row of every base is listed with `chosen on` = `NOT_SELECTED`.
    Index: (base, rule, method, chosen on); columns (set, metric) as `per_set_table(averages=False)`.
    """
    rows = _rule_rows(results)
    table = per_set_table(rows, averages=False).droplevel("family")
    names = rows.drop_duplicates("method").set_index("method")[["base", "rule"]]
    if selection is None:
        first = {b: i for i, b in enumerate(dict.fromkeys(rows["base"]))}
        keys = sorted(((b, r, m, NOT_SELECTED) for m, (b, r) in names.loc[table.index].iterrows()),
                      key=lambda k: first[k[0]])
    else:
        keys = []
        for _, pick in selection[selection["chosen"]].iterrows():
            match = names[(names["base"] == pick["base"]) & (names["rule"] == pick["rule"])]
            if match.empty:
                raise UserInputError(f"rule-selection table: base {pick['base']!r} rule {pick['rule']!r} has no row in "
                                     "the results table")
            keys.append((pick["base"], pick["rule"], match.index[0], _chosen_label(pick)))
    out = table.loc[[k[2] for k in keys]]
    out.index = pd.MultiIndex.from_tuples(keys, names=["base", "rule", "method", "chosen on"])
    return out


__all__ = ["COMPANIONS", "companion_files", "CELL_METRICS", "FAMILY_ORDER", "GROUP_ORDER", "GROUP_MISSING", "ALL",
           "AVERAGE", "LOW_AUROC", "NOT_SELECTED",
           "read_table", "metric_scale", "to_percent", "group_labels", "text_column", "read_results",
           "select_methods", "ordered", "Layout", "per_set_table", "method_info", "family_table", "method_summary",
           "family_group_table", "low_auroc", "rank_marks", "read_rule_selection", "best_rule_table"]
