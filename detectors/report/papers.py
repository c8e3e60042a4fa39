"""The two papers' layouts: the tables and figures each prints, from the runs' tables and companion files.

- Open-Insects (`--layout open-insects`, one run per region): Table 2/7 (AUROC on local / non-local / non-moth OOD and
  ID accuracy; three method categories; each training method with its rule chosen on validation), Table 4 (precision
  / recall at the threshold transferred to the field set), Table 5 (species and images per set and hop), Table 6
  (novel species detected in the field set), Figure 1 (AUROC across methods per OOD type and region), Figure 3 (the
  field set's novel-species images, flagged or missed).
- ShiftedBronzes (`--layout shiftedbronzes`): Table 2 (the classifier's accuracy per head, `metrics.json`), Table 3
  (methods x sets with the Average column), Table 4 (families x All | Hard | Easy), Figures 5, 6, 7 and 2(c).

Display names come from `names`; every value is the one the generic tables compute (`tables`, `scores`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from detectors.report import plots
from detectors.report.html import Section
from detectors.report.names import CATEGORIES, category, family_label, method_label
from detectors.report.render import MISSING, Part, View, frame_view, grid_view, number, per_set_view, scale_note
from detectors.report.scores import attach_metadata, has_sources, read_scores, species_field_table, species_summary
from detectors.report.sections import Out, field_sheets, grid_csv
from detectors.report.tables import (ALL, Layout, companion_files, family_group_table, method_info, method_summary, per_set_table,
                                     read_results, read_rule_selection, read_table, text_column, to_percent)
from pipelines.data import read_manifest
from pipelines.errors import UserInputError

OOD_TYPES = {"local": "L", "non_local": "NL", "non_moth": "NM"}
"""Open-Insects' OOD sets and their column headers (Table 2/7); other sets follow under their own names."""


# -- inputs -----------------------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One run folder's tables: the results (percent), their scale and the companions that exist."""

    name: str
    folder: Path
    results: pd.DataFrame
    scale: str
    selection: pd.DataFrame | None = None
    transfer: pd.DataFrame | None = None
    scores: pd.DataFrame | None = None

    @classmethod
    def read(cls, name: str, results: str | os.PathLike, scores: bool = True) -> "Run":
        frame, scale = read_results(results)
        found = companion_files(results)
        selection = read_rule_selection(found["rule_selection"]) if "rule_selection" in found else None
        transfer = read_table(found["threshold_transfer"], ("method", "source", "target", "threshold", "precision",
                                                            "recall"), "threshold-transfer table") \
            if "threshold_transfer" in found else None
        table = read_scores(found["scores"]) if scores and "scores" in found else None
        return cls(name, Path(results).parent, frame, scale, selection, transfer, table)


def region_name(spec: str) -> tuple[str, Path]:
    """`NAME=PATH` or `PATH` (named by its run folder) -> (name, path)."""
    name, sep, path = spec.partition("=")
    return (name, Path(path)) if sep and name and "/" not in name else (Path(spec).parent.name or spec, Path(spec))


def relabel(view: View) -> View:
    """A view whose first index levels (family, method) show the papers' names."""
    def names(keys: tuple[str, ...]) -> tuple[str, ...]:
        family, *rest = keys
        if rest:
            method, heads = rest[0].removesuffix(" (heads)"), rest[0].endswith(" (heads)")
            rest[0] = method_label(method) + (" (heads)" if heads else "")
        return (family_label(family), *rest)

    return replace(view, rows=[(names(k), cells) for k, cells in view.rows])


# -- Open-Insects -----------------------------------------------------------------------------------------------------
def chosen_rows(run: Run) -> pd.DataFrame:
    """Table 2/7's rows of one run: every post-hoc method, and per training method (`base`) the row of the rule
    chosen on validation (`rule_selection.csv`; its own score without one). Columns `row` (display key: the base or
    the method), `category`, `rule`, `method`, then the results' columns."""
    frame = run.results
    base = text_column(frame["base"]) if "base" in frame.columns else pd.Series("", index=frame.index)
    rule = text_column(frame["rule"]) if "rule" in frame.columns else pd.Series("", index=frame.index)
    frame = frame.assign(base=base, rule=rule)
    picked = {}
    if run.selection is not None:
        for _, pick in run.selection[run.selection["chosen"]].iterrows():
            picked[pick["base"]] = pick["rule"]
    keep = (frame["family"] == "posthoc") & (frame["base"] == "")
    for b in dict.fromkeys(frame.loc[frame["base"] != "", "base"]):
        keep |= (frame["base"] == b) & (frame["rule"] == picked.get(b, ""))
    out = frame[keep].copy()
    out["row"] = np.where(out["base"] != "", out["base"], out["method"])
    out["category"] = [category(f, b, m) for f, b, m in zip(out["family"], out["base"], out["method"])]
    return out[out["category"].notna()]


def _marks(values: pd.Series, groups: pd.Series) -> pd.Series:
    """1 for the best (highest, as rendered) in its group, 2 for the best overall, 3 for both."""
    rounded = values.round(2)
    best_in = rounded == rounded.groupby(groups).transform("max")
    best = rounded == rounded.max()
    return (best_in.astype(int) + 2 * best.astype(int)).where(rounded.notna(), 0)


def open_insects_table2(runs: list[Run]) -> tuple[View, pd.DataFrame]:
    """Table 2/7: rows by category then method, per region the AUROC of each OOD type and ID accuracy (the chosen
    rule named for training methods); best per category bold, best overall underlined, per column."""
    long = pd.concat([chosen_rows(r).assign(region=r.name) for r in runs], ignore_index=True)
    sets = list(dict.fromkeys([s for s in OOD_TYPES if s in set(long["ood_set"])] + list(long["ood_set"])))
    rows = []
    for c in CATEGORIES:
        rows += [(c, m) for m in dict.fromkeys(long.loc[long["category"] == c, "row"])]
    index = pd.MultiIndex.from_tuples(rows, names=["category", "row"])
    values: dict[tuple[str, str], pd.Series] = {}
    rule_of: dict[str, pd.Series] = {}
    for run in runs:
        part = long[long["region"] == run.name]
        auroc = part.pivot_table(index=["category", "row"], columns="ood_set", values="auroc", sort=False)
        for s in sets:
            values[(run.name, s)] = auroc[s].reindex(index) if s in auroc.columns else pd.Series(np.nan, index=index)
        first = part.drop_duplicates("row").set_index(["category", "row"])
        acc = first["id_acc"] if "id_acc" in first.columns else pd.Series(np.nan, index=first.index)
        values[(run.name, "id_acc")] = acc.reindex(index).astype(np.float64)
        rule_of[run.name] = first["rule"].reindex(index).fillna("")
    wide = pd.DataFrame(values, index=index)
    rules = pd.DataFrame(rule_of, index=index)
    categories = pd.Series([k[0] for k in index], index=index)
    marks = {c: _marks(wide[c], categories) for c in wide.columns}
    with_rules = [r.name for r in runs if (rules[r.name] != "").any()]
    columns, spans, short = [], [], []
    for run in runs:
        names = ([f"{run.name}: rule"] if run.name in with_rules else []) + \
            [f"{run.name}: {OOD_TYPES.get(s, s)}" for s in sets] + [f"{run.name}: ID acc."]
        columns += names
        spans.append((run.name, len(names)))
        short += (["rule"] if run.name in with_rules else []) + [OOD_TYPES.get(s, s) for s in sets] + ["ID acc."]
    out_rows = []
    for key in index:
        cells = []
        for run in runs:
            if run.name in with_rules:
                cells.append((Part(method_label(rules.loc[key, run.name]) if rules.loc[key, run.name] else MISSING),))
            for metric in [*sets, "id_acc"]:
                cells.append((Part(number(wide.loc[key, (run.name, metric)]), int(marks[(run.name, metric)][key])),))
        out_rows.append(((key[0], method_label(key[1])), cells))
    note = ("AUROC (%) on each OOD type (L local, NL non-local, NM non-moth) and ID top-1 accuracy (%), per region. "
            "Training methods are shown with the post-hoc rule chosen on validation (rule_selection.csv; `–`: the "
            "method's own score). Per column, best within a category in bold, best overall underlined.")
    view = View(note, ["Category", "Method"], columns, out_rows, spans, short, merge_first=True)
    flat = wide.copy()
    flat.columns = [f"{r}/{m}" for r, m in wide.columns]
    for run in runs:
        flat[f"{run.name}/rule"] = rules[run.name]
    return view, flat.reset_index()


def open_insects_table4(runs: list[Run]) -> tuple[list[View], pd.DataFrame]:
    """Table 4: per (source, target) of threshold transfer, the Table 2 rows' precision and recall (%) per region."""
    parts = []
    for run in runs:
        if run.transfer is None:
            continue
        chosen = chosen_rows(run).drop_duplicates("method").set_index("method")
        transfer, _ = to_percent(run.transfer, ("precision", "recall"))
        transfer = transfer[transfer["method"].isin(chosen.index)].copy()
        transfer["category"] = transfer["method"].map(chosen["category"])
        transfer["row"] = transfer["method"].map(chosen["row"])
        parts.append(transfer.assign(region=run.name))
    if not parts:
        return [], pd.DataFrame()
    long = pd.concat(parts, ignore_index=True)
    views = []
    regions = [r.name for r in runs if r.name in set(long["region"])]
    for (source, target), part in long.groupby(["source", "target"], sort=False):
        keys = [(c, m) for c in CATEGORIES for m in dict.fromkeys(part.loc[part["category"] == c, "row"])]
        indexed = part.set_index(["region", "category", "row"])
        rows = []
        for key in keys:
            cells = []
            for region in regions:
                for metric in ("precision", "recall"):
                    value = indexed[metric].get((region, *key), np.nan)
                    cells.append((Part(number(value)),))
            rows.append(((key[0], method_label(key[1])), cells))
        columns = [f"{r}: {m}" for r in regions for m in ("precision", "recall")]
        note = (f"Precision and recall (%) of OOD on {target} at the threshold chosen on {source} (flag OOD iff score "
                "< threshold; the field set's own ID images are the negatives).")
        views.append(View(note, ["Category", "Method"], columns, rows, [(r, 2) for r in regions],
                          ["precision", "recall"] * len(regions), merge_first=True, title=f"{source} → {target}"))
    return views, long


def split_counts(folder: str | os.PathLike) -> tuple[pd.DataFrame, list[str]]:
    """Table 5's counts from a splits folder: `summary.json` (`sets`: name, role, split, species, images; `dropped`,
    `shortfalls` as notes) when present, else `summary.csv` (today's: region, set, species, images, hop images).
    Returns the table and note lines."""
    folder = Path(folder)
    if (folder / "summary.json").is_file():
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        if not isinstance(summary, dict) or not isinstance(summary.get("sets"), list):
            raise UserInputError(f"{folder / 'summary.json'}: expected an object with a `sets` list")
        table = pd.DataFrame(summary["sets"])
        notes = [f"dropped {k}: {v}" for k, v in (summary.get("dropped") or {}).items()]
        notes += [f"shortfall: {s}" for s in summary.get("shortfalls") or []]
        return table, notes
    if (folder / "summary.csv").is_file():
        return pd.read_csv(folder / "summary.csv"), []
    raise UserInputError(f"--splits {folder}: no summary.json or summary.csv (written by scripts/make_splits.py)")


def hop_counts(folder: str | os.PathLike) -> pd.DataFrame:
    """Species and images per (region, set, split, hop) from the region manifests under a splits folder (the folders
    holding a metadata.jsonl); empty when there are none."""
    rows = []
    for manifest_dir in sorted(p.parent for p in Path(folder).glob("*/metadata.jsonl")):
        frame = pd.DataFrame(read_manifest(manifest_dir).rows)
        if "hop" not in frame.columns or "species" not in frame.columns:
            continue
        frame["set"] = frame["ood_set"].where(frame["role"] == "ood", "id") if "ood_set" in frame else "id"
        frame["hop"] = pd.to_numeric(frame["hop"], errors="coerce").astype("Int64")
        counts = frame.groupby(["set", "split", "hop"], sort=False, dropna=False).agg(
            species=("species", "nunique"), images=("file_name", "size")).reset_index()
        rows.append(counts.assign(region=manifest_dir.name))
    if not rows:
        return pd.DataFrame()
    out = pd.concat(rows, ignore_index=True)
    return out[["region", "set", "split", "hop", "species", "images"]]


def table2_section(out: Out, runs: list[Run]) -> Section:
    view, flat = open_insects_table2(runs)
    return Section("Table 2/7: AUROC per OOD type and ID accuracy", [view], out.tables("table2", [view], flat))


def table4_section(out: Out, runs: list[Run]) -> Section | None:
    views, long = open_insects_table4(runs)
    if not views:
        return None
    return Section("Table 4: threshold transfer (precision / recall)", views, out.tables("table4", views, long))


def table5_section(out: Out, splits: Path) -> Section:
    table, notes = split_counts(splits)
    hops = hop_counts(splits)
    views = [frame_view(table, "Species and images per set (and split) of the species splits. " + " ".join(notes),
                        {"species": ".0f", "images": ".0f"})]
    if not hops.empty:
        hops = hops.astype({"hop": object})
        views.append(frame_view(hops, "Species and images per set, split and taxonomic hop (0 ID; 1 same genus, 2 same "
                                      "family, 3 farther), from the region manifests.",
                                {"species": ".0f", "images": ".0f"}))
    csv = pd.concat([table.assign(part="sets"), hops.assign(part="hops")], ignore_index=True) if not hops.empty else table
    return Section("Table 5: species and images per set and hop", views, out.tables("table5", views, csv))


def _field_rows(run: Run) -> pd.DataFrame | None:
    if run.scores is None or run.transfer is None or not has_sources(run.scores):
        return None
    field = run.scores[run.scores["role"].isin(["field_id", "field_ood"])]
    if field.empty:
        return None
    return attach_metadata(field, ["species"], run.folder)


def table6_section(out: Out, runs: list[Run]) -> Section | None:
    """Table 6: per region and Table 2 method, the field set's novel species and the share of their images flagged
    at the transferred threshold."""
    views, frames = [], []
    for run in runs:
        field = _field_rows(run)
        if field is None:
            continue
        chosen = set(chosen_rows(run)["method"])
        per_species = species_field_table(field, run.transfer[run.transfer["method"].isin(chosen)])
        if per_species.empty:
            continue
        summary = species_summary(per_species)
        summary.insert(0, "method", summary.pop("method").map(method_label))
        views.append(frame_view(summary, f"{run.name}: novel species of the field set detected at the transferred "
                                "threshold (`images_flagged`: share of their images, the paper's \"species detected\").",
                                {"species": ".0f", "images": ".0f", "flagged": ".0f"}))
        views[-1] = replace(views[-1], title=run.name)
        frames.append(per_species.assign(region=run.name))
    if not views:
        return None
    return Section("Table 6: novel species detected in the field set", views,
                   out.tables("table6", views, pd.concat(frames, ignore_index=True)))


def figure3_section(out: Out, runs: list[Run], per_species: int = 4) -> Section | None:
    """Figure 3: per region and field set, up to `per_species` novel-species images per species for the method of best
    recall at the transferred threshold, each marked flagged or missed."""
    images = []
    for run in runs:
        field = _field_rows(run)
        if field is None:
            continue
        chosen = run.transfer[run.transfer["method"].isin(set(chosen_rows(run)["method"]))]
        images += field_sheets(out, field, chosen, f"figure3_{run.name}", run.name, per_species)
    return Section("Figure 3: novel species in the field set, flagged or missed", images=images) if images else None


def figure1_section(out: Out, runs: list[Run]) -> Section:
    """Figure 1: the AUROC of Table 2's rows per OOD type and region."""
    long = pd.concat([chosen_rows(r).assign(region=r.name) for r in runs], ignore_index=True)
    order = [s for s in OOD_TYPES if s in set(long["ood_set"])] + [s for s in dict.fromkeys(long["ood_set"])
                                                                    if s not in OOD_TYPES]
    long["ood_set"] = pd.Categorical(long["ood_set"], order)
    frame = long.sort_values("ood_set", kind="mergesort")[["region", "ood_set", "row", "auroc"]]
    frame = frame.rename(columns={"row": "method"}).astype({"ood_set": str})
    images = out.figure(plots.auroc_distribution_figure, "figure1", frame=frame)
    return Section("Figure 1: AUROC across methods per OOD type and region", images=images)


def open_insects_sections(out: Out, runs: list[Run], splits: Path | None) -> list[Section]:
    """Every Open-Insects section whose inputs exist."""
    sections = [table2_section(out, runs)]
    for section in (table4_section(out, runs), table5_section(out, splits) if splits is not None else None,
                    table6_section(out, runs), figure1_section(out, runs), figure3_section(out, runs)):
        if section is not None and (section.views or section.images):
            sections.append(section)
    return sections


# -- ShiftedBronzes ---------------------------------------------------------------------------------------------------
def classifier_table(metrics: dict) -> pd.DataFrame:
    """Table 2 from a classifier's `metrics.json`: a row per split (val, test), a column per head (the primary head
    named by its label field), then `overall` (every head right), in percent."""
    top1 = metrics.get("top1") or {}
    label = metrics.get("label_field") or "label"
    rows = []
    for split in ("val", "test"):
        values = top1.get(split) or {}
        if values:
            rows.append({"split": split, **{(label if k == "label" else k): float(v) * (100 if float(v) <= 1 else 1)
                                            for k, v in values.items()}})
    return pd.DataFrame(rows)


def sb_table2_section(out: Out, path: Path) -> Section | None:
    path = path / "metrics.json" if path.is_dir() else path
    if not path.is_file():
        raise UserInputError(f"--classifier: {path} not found (the classifier folder's metrics.json)")
    table = classifier_table(json.loads(path.read_text(encoding="utf-8")))
    if table.empty:
        out.log(f"report: Table 2: {path} has no top-1 accuracies")
        return None
    view = frame_view(table, f"Dating accuracy (top-1, %) of the classifier ({path}), per head: the primary label, "
                             "each level (era, category, ...), and `overall` (every head right).")
    return Section("Table 2: dating accuracy", [view], out.tables("sb_table2", [view], table))


def sb_table3_section(out: Out, results: pd.DataFrame, scale: str) -> Section:
    """Table 3: methods x sets grouped by group, then the Average over all sets."""
    layout = Layout.of(results)
    table = per_set_table(results, averages=True)
    keep = [c for c in table.columns if c[0] in layout.sets or c[0] == f"{ALL} avg"]
    table = table[keep].rename(columns={f"{ALL} avg": "Average"}, level="column")
    view = per_set_view(table, layout, scale, method_info(results))
    view = relabel(replace(view, spans=[*view.spans, ("", 1)], short=[*view.short, "Average"]))
    return Section("Table 3: methods x OOD sets", [view], out.tables("sb_table3", [view], grid_csv(table)))


def sb_table4_section(out: Out, results: pd.DataFrame, scale: str) -> Section:
    table = family_group_table(results)
    note = (f"Family means (plain means over each family's own methods of per-set values), FPR@95 / AUROC in percent. "
            f"{scale_note(scale)}")
    view = grid_view(table.rename(index=family_label), ["Family"], note, flag=False)
    return Section("Table 4: family x group", [view], out.tables("sb_table4", [view], grid_csv(table)))


def _two_best(results: pd.DataFrame) -> list[str]:
    summary = method_summary(results)[(f"{ALL} avg", "auroc")].droplevel("family")
    return list(summary.sort_values(ascending=False, kind="mergesort").dropna().index[:2])


def figure6_section(out: Out, results: pd.DataFrame, scores: pd.DataFrame) -> Section | None:
    """Figure 6: the two methods of best mean AUROC, ID test against the pooled OOD of each group."""
    panels = []
    for method in _two_best(results):
        rows = scores[scores["method"] == method]
        series = {"ID": rows.loc[rows["role"] == "id", "score"].to_numpy(np.float64)}
        ood = rows[rows["role"] == "ood"]
        for group, part in ood.groupby("group", sort=False):
            series[f"{group} OOD"] = part["score"].to_numpy(np.float64)
        if len(series) > 1 and len(series["ID"]):
            panels.append((method, series))
    if not panels:
        return None
    images = out.figure(plots.best_densities_figure, "sb_figure6", panels=panels)
    return Section("Figure 6: score densities of the two best methods", images=images,
                   text=["Methods of best mean AUROC over all OOD sets; OOD scores pooled per group."])


def sb_figure_sections(out: Out, results: pd.DataFrame, scores: pd.DataFrame | None, fewshot: Path | None,
                       feature_maps: Path | None) -> list[Section]:
    layout = Layout.of(results)
    sections = [Section("Figure 5: FPR@95 by family", images=out.figure(
        plots.fpr95_figure, "sb_figure5", summary=method_summary(results), layout=layout))]
    if scores is not None:
        found = figure6_section(out, results, scores)
        sections += [found] if found is not None else []
    if fewshot is not None and fewshot.is_file():
        frame = read_table(fewshot, ("method", "shots", "seed", "ood_set", "group", "auroc", "fpr95", "id_acc"),
                           "few-shot table")
        sections.append(Section("Figure 7: few-shot prompt learning", images=out.figure(
            plots.fewshot_figure, "sb_figure7", frame=frame)))
    maps = sorted(feature_maps.glob("feature_map_*.csv")) if feature_maps is not None and feature_maps.is_dir() else []
    if maps:
        from detectors.report.feature_map import feature_map_figure

        images = []
        for path in maps:
            points = read_table(path, ("set", "x", "y"), "feature map")
            images += out.figure(feature_map_figure, f"sb_figure2c_{path.stem.removeprefix('feature_map_')}",
                                 points=points, title=f"t-SNE: {path.stem.removeprefix('feature_map_')}")
        sections.append(Section("Figure 2(c): feature maps of the data types", images=images))
    return sections


def shiftedbronzes_sections(out: Out, results: pd.DataFrame, scale: str, scores: pd.DataFrame | None,
                            classifier: Path | None, fewshot: Path | None, feature_maps: Path | None) -> list[Section]:
    """Every ShiftedBronzes section whose inputs exist."""
    sections = [sb_table2_section(out, classifier)] if classifier is not None else []
    sections += [sb_table3_section(out, results, scale), sb_table4_section(out, results, scale)]
    sections += sb_figure_sections(out, results, scores, fewshot, feature_maps)
    return [s for s in sections if s is not None and (s.views or s.images)]


__all__ = ["OOD_TYPES", "Run", "region_name", "relabel", "chosen_rows", "open_insects_table2", "open_insects_table4",
           "split_counts", "hop_counts", "open_insects_sections", "classifier_table", "shiftedbronzes_sections"]
