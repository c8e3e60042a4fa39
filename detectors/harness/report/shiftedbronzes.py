"""ShiftedBronzes' layout (`--layout shiftedbronzes`): the paper's tables and figures.

- Table 3 (first on the page): methods (Post-hoc, VLM-based, Generation-based; the paper's order and spellings) x the
  nine OOD sets (Hard | Easy), `FPR@95 / AUROC`, then the Average over all sets.
- Table 4: families x All | Hard | Easy (plain means over each family's methods of the per-set values).
- Table 2: dating accuracy (top-1, %, ID test) per dating model: each `--classifier` (the paper compares several
  fine-grained classifiers) with its overall accuracy (every head right) and one column per head (era, category,
  ...), from its `metrics.json`; then the methods that date with a model of their own (VLM-based prompt learners: their
  `id_acc`). Methods that score a `--classifier`'s predictions (post-hoc, generation-based) share its row.
- Figure 5: FPR@95 per method by family, all / hard / easy means (black / green / red; the paper's colours),
  side by side; Figure 6: the score densities of the two methods of lowest mean FPR@95 (the paper's criterion);
  Figure 7: the few-shot curves; Figure 2(c): the feature maps, one panel per model, side by side.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from detectors.harness.report import plots
from detectors.harness.report.html import Section
from detectors.harness.report.names import SHIFTED_BRONZES, family_label, group_label, method_label, set_short
from detectors.harness.report.render import FLAG_NOTE, Part, View, grid_cells, grid_view, number, scale_note
from detectors.harness.report.sections import Out, grid_csv
from detectors.harness.report.tables import (
    ALL,
    Layout,
    family_group_table,
    method_info,
    method_summary,
    per_set_table,
    rank_marks,
    read_table,
)
from pipelines.errors import UserInputError

PAPER = SHIFTED_BRONZES
AVERAGE = "Average"
ACC_TOLERANCE = 0.005
"""Percent: a method whose `id_acc` is within this of a classifier's primary top-1 scores that classifier."""


def layout_of(results: pd.DataFrame) -> Layout:
    """The paper's row order: Post-hoc, VLM-based, Generation-based, each in the paper's method order."""
    return Layout.of(results, PAPER.families, PAPER.sorted)


# -- Table 3
# ------------------------------------------------------------------------------------------------------------
def table3(results: pd.DataFrame) -> pd.DataFrame:
    """Methods x (sets, `Average` over all sets), index (family, method), columns (column, metric), percent."""
    layout = layout_of(results)
    table = per_set_table(results, averages=True, layout=layout)
    keep = [c for c in table.columns if c[0] in layout.sets or c[0] == f"{ALL} avg"]
    return table[keep].rename(columns={f"{ALL} avg": AVERAGE}, level="column")


def table3_view(results: pd.DataFrame, scale: str) -> View:
    layout = layout_of(results)
    table = table3(results)
    cells = grid_cells(table, flag_columns=layout.sets)
    columns = [f"{set_short(c)} ({group_label(layout.group_of(c))})" if c in layout.sets else c for c in cells.columns]
    spans = [(group_label(g), len(s)) for g, s in layout.groups.items()] + [("", 1)]
    short = [set_short(s) for s in layout.sets] + [AVERAGE]
    rows = [((family_label(f), method_label(m, PAPER)), list(row)) for (f, m), row in cells.iterrows()]
    note = ("Cells: FPR@95 / AUROC (%). Best per column and metric in bold, second best underlined (markdown: "
            f"italics). Average: the mean over all {len(layout.sets)} sets. {scale_note(scale)}")
    flagged = any(p.flag for _, cs in rows for c in cs for p in c)
    return View(note, ["Family", "Method"], columns, rows, spans, short, merge_first=True, html_id="main-table",
                extra_notes=[FLAG_NOTE] if flagged else [])


def table3_section(out: Out, results: pd.DataFrame, scale: str) -> Section:
    view = table3_view(results, scale)
    return Section("Table 3: FPR@95 / AUROC per OOD set", [view],
                   out.tables("sb_table3", [view], grid_csv(table3(results))))


# -- Table 4
# ------------------------------------------------------------------------------------------------------------
def table4_section(out: Out, results: pd.DataFrame, scale: str) -> Section:
    layout = layout_of(results)
    table = family_group_table(results, layout)
    note = ("Family means: per family, the plain mean over its methods of each method's mean per-set value; FPR@95 / "
            f"AUROC in percent. {scale_note(scale)}")
    shown = table.rename(index=family_label).rename(columns=group_label, level="column")
    view = grid_view(shown, ["Family"], note, flag=False)
    return Section("Table 4: family means, All | Hard | Easy", [view], out.tables("sb_table4", [view], grid_csv(table)))


# -- Table 2
# ------------------------------------------------------------------------------------------------------------
def classifier_spec(spec: str | os.PathLike) -> tuple[str, Path]:
    """`NAME=PATH` or `PATH` (a classifier folder or its metrics.json; named by the folder) -> (name, metrics.json)."""
    text = str(spec)
    name, sep, path = text.partition("=")
    if not (sep and name and "/" not in name):
        name, path = "", text
    path = Path(path)
    metrics = path / "metrics.json" if path.is_dir() else path
    if not metrics.is_file():
        raise UserInputError(f"--classifier: {metrics} not found (the classifier folder's metrics.json)")
    return name or (path.name if path.is_dir() else path.parent.name), metrics


def classifier_accuracy(metrics: dict, checkpoint: str = "last") -> dict[str, float]:
    """Top-1 ID test accuracy (%) per head of a classifier's `metrics.json` (the primary head named by its label
    field) and `overall` (every head right; the primary head's accuracy when it has one head), of the `checkpoint`
    the evaluation scored (`last` | `best`: metrics.json's `checkpoints`; `top1` is the last epoch's)."""
    kept = (metrics.get("checkpoints") or {}).get(checkpoint) or {}
    test = kept.get("test") or (metrics.get("top1") or {}).get("test") or {}
    label = metrics.get("label_field") or "label"
    out = {(label if k == "label" else k): float(v) * (100 if float(v) <= 1 else 1) for k, v in test.items()}
    if "overall" not in out and len(out) == 1:
        out["overall"] = next(iter(out.values()))
    return out


def scored_checkpoint(results: pd.DataFrame) -> str:
    """The classifier checkpoint the run evaluated (results' `checkpoint` column: `last` | `best`; `last` where the
    rows do not say, as older runs and folders without a best epoch)."""
    named = {str(c) for c in results.get("checkpoint", pd.Series(dtype=str)).dropna() if str(c) in ("last", "best")}
    return named.pop() if len(named) == 1 else "last"


def table2(classifiers: list[tuple[str, dict]], results: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Rows (kind, model): each classifier's accuracies, then each method with an ID accuracy of its own; columns
    `overall` then every head. Also the note lines naming the methods that share a classifier's row."""
    accuracy = {name: classifier_accuracy(m, scored_checkpoint(results)) for name, m in classifiers}
    primary = {name: (m.get("label_field") or "label") for name, m in classifiers}
    heads = list(dict.fromkeys(h for acc in accuracy.values() for h in acc if h != "overall"))
    rows = {("Dating model", name): acc for name, acc in accuracy.items()}
    info = method_info(results)
    layout = layout_of(results)
    shared: dict[str, list[str]] = {}
    unknown = []
    for family, method in layout.rows:
        acc = info.loc[method, "id_acc"]
        if not np.isfinite(acc):
            unknown.append(method)
            continue
        owner = next((n for n in accuracy if abs(accuracy[n].get(primary[n], np.nan) - acc) <= ACC_TOLERANCE), None)
        if owner is not None:
            shared.setdefault(owner, []).append(method)
        else:
            label = primary[next(iter(primary))] if primary else "label"
            rows[(family_label(family), method_label(method, PAPER))] = {"overall": acc, label: acc}
            heads = heads or [label]
    frame = pd.DataFrame.from_dict(rows, orient="index").reindex(columns=["overall", *heads])
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=["kind", "model"])
    notes = [f"{', '.join(method_label(m, PAPER) for m in methods)} score {name}'s predictions: its row is their ID "
             "accuracy." for name, methods in shared.items()]
    if unknown:
        notes.append(f"No ID accuracy recorded for {', '.join(method_label(m, PAPER) for m in unknown)}.")
    return frame, notes


def table2_section(out: Out, classifiers: list[str | os.PathLike], results: pd.DataFrame) -> Section | None:
    specs = [classifier_spec(c) for c in classifiers]
    loaded = [(name, json.loads(path.read_text(encoding="utf-8"))) for name, path in specs]
    frame, notes = table2(loaded, results)
    if frame.empty or frame.isna().all(axis=None):
        out.log("report: Table 2: no top-1 accuracy in the classifiers' metrics.json nor in the results")
        return None
    marks = {c: rank_marks(frame[c], lower_is_better=False) for c in frame.columns}
    rows = [(key, [(Part(number(frame.loc[key, c]), 1 if marks[c][key] == 1 else 0),) for c in frame.columns])
            for key in frame.index]
    headers = ["Overall", *(c.replace("_", " ").capitalize() for c in frame.columns[1:])]
    note = ("Dating accuracy (top-1, %) on the ID test split: Overall (every head right), then each head (the "
            "primary label and each level: era, category, ...); best per column in bold. " + " ".join(notes))
    view = View(note, ["", "Model"], headers, rows, merge_first=True)
    flat = frame.reset_index()
    return Section("Table 2: dating accuracy", [view], out.tables("sb_table2", [view], flat))


# -- figures
# ------------------------------------------------------------------------------------------------------------
def two_best(results: pd.DataFrame) -> list[str]:
    """Figure 6's methods: the two of lowest mean FPR@95 over all sets (the paper's criterion); ties: higher mean
    AUROC, then the paper's order."""
    layout = layout_of(results)
    summary = method_summary(results, layout).droplevel("family")
    frame = pd.DataFrame({"fpr95": summary[(f"{ALL} avg", "fpr95")], "auroc": summary[(f"{ALL} avg", "auroc")],
                          "rank": range(len(summary))}).dropna()
    return list(frame.sort_values(["fpr95", "auroc", "rank"], ascending=[True, False, True],
                                  kind="mergesort").index[:2])


FIGURE6_NOTE = ("The two methods of lowest mean FPR@95 over all OOD sets (ties: higher mean AUROC, then the paper's "
                "order); OOD scores pooled per group.")


def figure6_section(out: Out, results: pd.DataFrame, scores: pd.DataFrame) -> Section | None:
    """Figure 6: ID test against the pooled OOD of each group, for the two best methods."""
    panels = []
    for method in two_best(results):
        rows = scores[scores["method"] == method]
        series = {"ID": rows.loc[rows["role"] == "id", "score"].to_numpy(np.float64)}
        for group, part in rows[rows["role"] == "ood"].groupby("group", sort=False):
            series[f"{group} OOD"] = part["score"].to_numpy(np.float64)
        if len(series) > 1 and len(series["ID"]):
            panels.append((method_label(method, PAPER), series, plots.ScoreAxis.of(rows)))
    if not panels:
        return None
    images = out.figure(plots.best_densities_figure, "sb_figure6", panels=panels)
    caption = (FIGURE6_NOTE + f" x axis: the {plots.ROBUST[0]}-{plots.ROBUST[1]} percentiles of the method's scores "
               "(the legend counts the values outside); a heavy-tailed method's axis is the signed log distance from "
               "the ID median, as its label says.")
    return Section("Figure 6: score densities of the two best methods", images=images,
                   captions={i: caption for i in images})


def feature_map_title(stem: str) -> str:
    """A display title from a `feature_map_<kind>_<model>` stem: `ResNet-50 (classifier)`, `CLIP ViT-B/16`."""
    kind, _, model = stem.removeprefix("feature_map_").partition("_")
    name = plots.model_label(model or kind)
    return f"{name}" if kind == "clip" and name.startswith("CLIP") else f"{name} ({kind})"


def figure_sections(out: Out, results: pd.DataFrame, scores: pd.DataFrame | None, fewshot: Path | None,
                    feature_maps: Path | None) -> list[Section]:
    layout = layout_of(results)
    images = out.figure(plots.fpr95_figure, "sb_figure5", summary=method_summary(results, layout), layout=layout,
                        paper=PAPER)
    caption = ("FPR@95 (%) per method, grouped by family; each method's mean over all sets (black circle), the hard "
               "sets (green triangle) and the easy sets (red square), drawn side by side (offset on x) so that none "
               "hides another; the lines are the means over all methods (solid all, dashed hard, dotted easy).")
    sections = [Section("Figure 5: FPR@95 by family", images=images, captions={i: caption for i in images})]
    if scores is not None:
        found = figure6_section(out, results, scores)
        sections += [found] if found is not None else []
    if fewshot is not None and fewshot.is_file():
        frame = read_table(fewshot, ("method", "shots", "seed", "ood_set", "group", "auroc", "fpr95", "id_acc"),
                           "few-shot table")
        images = out.figure(plots.fewshot_figure, "sb_figure7", frame=frame, paper=PAPER)
        caption = ("ID accuracy, then AUROC and FPR@95 per group, against shots per class: mean ± std over seeds and "
                   "the group's sets (bars cut to [0, 100]); methods nudged apart on x with their own markers.")
        sections.append(Section("Figure 7: few-shot prompt learning", images=images,
                                captions={i: caption for i in images}))
    maps = sorted(feature_maps.glob("feature_map_*.csv")) if feature_maps is not None and feature_maps.is_dir() else []
    if maps:
        panels = [(feature_map_title(p.stem), read_table(p, ("set", "x", "y"), "feature map")) for p in maps]
        images = out.figure(plots.feature_maps_figure, "sb_figure2c", panels=panels)
        caption = "t-SNE of each model's features of the data types, one panel per model, side by side."
        sections.append(Section("Figure 2(c): feature maps of the data types", images=images,
                                captions={i: caption for i in images}))
    return sections


def shiftedbronzes_sections(out: Out, results: pd.DataFrame, scale: str, scores: pd.DataFrame | None,
                            classifiers: list[str | os.PathLike], fewshot: Path | None,
                            feature_maps: Path | None) -> list[Section]:
    """Every ShiftedBronzes section whose inputs exist, Table 3 first."""
    sections = [table3_section(out, results, scale), table4_section(out, results, scale)]
    if classifiers or ("id_acc" in results.columns and results["id_acc"].notna().any()):
        sections.append(table2_section(out, list(classifiers), results))
    sections += figure_sections(out, results, scores, fewshot, feature_maps)
    return [s for s in sections if s is not None and (s.views or s.images)]


__all__ = ["PAPER", "AVERAGE", "layout_of", "table3", "table3_view", "table3_section", "table4_section",
           "classifier_spec", "classifier_accuracy", "table2", "table2_section", "two_best", "figure6_section",
           "feature_map_title", "figure_sections", "shiftedbronzes_sections"]
