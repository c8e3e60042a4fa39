"""The report's sections: each builds its tables and figures, writes them through `Out` and returns the `Section`
that `index.html` shows."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from detectors.harness.report import plots
from detectors.harness.report.figures import Job
from detectors.harness.report.html import MAIN_TABLE, WARNINGS_FILE, Section
from detectors.harness.report.names import Paper, family_label, method_label, region_label, set_label, unknown_methods
from detectors.harness.report.render import (
    FLAG_NOTE,
    Cell,
    Part,
    View,
    frame_view,
    grid_view,
    number,
    per_set_view,
    scale_note,
    to_latex,
    to_markdown,
)
from detectors.harness.report.scores import (
    HOP_LABELS,
    attach_metadata,
    bootstrap_table,
    has_sources,
    hop_table,
    id_looking_table,
    per_set_auroc,
    species_field_table,
    species_summary,
)
from detectors.harness.report.tables import (
    ALL,
    CELL_METRICS,
    NOT_SELECTED,
    Layout,
    best_rule_table,
    family_group_table,
    family_table,
    low_auroc,
    method_info,
    method_summary,
    per_set_table,
    read_table,
    text_column,
    to_percent,
)
from detectors.harness.results import COLUMN_LABELS, SPECIES_COLUMNS, TRANSFER_COLUMNS, TRANSFER_RATES
from pipelines.io import atomic_write_text, safe_name

TRANSFER_REQUIRED = tuple(c for c in TRANSFER_COLUMNS if c != "tpr")
"""Threshold-transfer columns every table has (older tables lack `tpr` and the species columns)."""
ROC_METHODS = 8
"""The ROC figure shows this many methods (those of best mean AUROC over the sets)."""
SHEET_METHODS = 12
"""At most this many methods (those of best AUROC on the set) get a row in a set's thumbnail sheet."""


@dataclass
class Out:
    """The report folder: writes files atomically and remembers them; queues figures (`jobs`, rendered together by
    `figures.render`) unless `formats` is empty; `log` sends one line per skipped part to `sink` and keeps it
    (`lines`: the page counts them)."""

    folder: Path
    sink: Callable[[str], None] = lambda line: None
    formats: tuple[str, ...] = ("png",)
    written: list[Path] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def log(self, line: str) -> None:
        self.lines.append(line)
        self.sink(line)

    def text(self, name: str, text: str) -> str:
        atomic_write_text(self.folder / name, text)
        self.written.append(self.folder / name)
        return name

    def tables(self, stem: str, views: list[View], csv: pd.DataFrame | None = None, latex: bool = True) -> list[str]:
        """`stem.md` (and `stem.tex`) with every view, `stem.csv` from `csv`; returns the file names."""
        names = [self.text(f"{stem}.md", "\n".join(to_markdown(v) for v in views))]
        if latex:
            names.append(self.text(f"{stem}.tex", "\n".join(to_latex(v) for v in views)))
        if csv is not None:
            names.append(self.text(f"{stem}.csv", csv.to_csv(index=False)))
        return names

    def figure(self, build: Callable[..., Any], stem: str, photo: bool = False, **kwargs: Any) -> list[str]:
        """Queue `build(**kwargs)` as `<stem>.png` (a `photo` mosaic, a thumbnail sheet: `<stem>.jpg`), and the
        other formats; returns [the page image's name], or [] when figures are off."""
        if not self.formats:
            return []
        raster = "jpg" if photo else "png"
        path = self.folder / f"{safe_name(stem)}.{raster}"
        formats = (raster, *(f for f in self.formats if f != "png")) if photo else None
        self.jobs.append(Job(build, path, kwargs, formats))
        return [path.name]

    def skip(self, section: Section, line: str) -> Section:
        """Log why `section` has nothing; it stays empty, and the page leaves empty sections out."""
        self.log(f"report: {section.title}: {line}")
        return section


def grid_csv(table: pd.DataFrame) -> pd.DataFrame:
    """A (column, metric) table flat for CSV: the index levels, then `<column>/<metric>`, full precision."""
    flat = table.copy()
    flat.columns = [f"{c}/{m}" for c, m in table.columns]
    return flat.reset_index()


# -- from the results table -------------------------------------------------------------------------------------------
@dataclass
class Warnings:
    """What the page warns about, per kind: a count line for the page's head and a table (or lines) for the details
    (the page's Warnings section, collapsed, and warnings.md)."""

    kinds: list[tuple[str, View]] = field(default_factory=list)

    def add(self, line: str, view: View) -> None:
        self.kinds.append((line, view))

    @property
    def summary(self) -> list[str]:
        return [line for line, _ in self.kinds]

    def section(self, out: Out) -> Section | None:
        """The details, collapsed, and warnings.md; None when there is nothing to warn about."""
        if not self.kinds:
            return None
        views = [replace(view, title=line) for line, view in self.kinds]
        files = [out.text(WARNINGS_FILE, "\n".join(f"## {v.title}\n\n{to_markdown(v)}" for v in views))]
        return Section("Warnings", views, files, collapsed=True)


def low_auroc_view(results: pd.DataFrame, paper: Paper | None = None) -> View | None:
    """The (method, set) pairs whose AUROC is below 50 (per `region` when the rows have one), in display names; None
    when there are none."""
    regions = results.groupby("region", sort=False) if "region" in results.columns else [("", results)]
    parts = [low_auroc(part).assign(region=region) for region, part in regions]
    low = pd.concat(parts, ignore_index=True)
    if low.empty:
        return None
    frame = pd.DataFrame({"Method": [method_label(m, paper) for m in low["method"]],
                          "Family": [family_label(f) for f in low["family"]],
                          "OOD set": [set_label(s) for s in low["ood_set"]], "Group": low["group"],
                          "AUROC": low["auroc"]})
    if "region" in results.columns:
        frame.insert(0, "Region", [region_label(r) for r in low["region"]])
    note = ("The detector scores these OOD images as more in-distribution than the ID test images (e.g. the classifier "
            "confidently calls them an ID class); group means hide this. " + FLAG_NOTE)
    return frame_view(frame, note)


def collect_warnings(out: Out, results: pd.DataFrame, paper: Paper | None = None) -> Warnings:
    """The warnings of the rows the report shows: AUROC below 50, config labels printed as given (in a paper's
    layout), and the parts left out (`out.lines`, added by `finish_warnings` once every section is built)."""
    found = Warnings()
    low = low_auroc_view(results, paper)
    if low is not None:
        found.add(f"{len(low.rows)} (method, set) pair(s) with AUROC below 50", low)
    labels = unknown_methods(results["method"]) if paper is not None else []
    if labels:
        view = frame_view(pd.DataFrame({"Method": labels}), "Method names that are no registered method (a config "
                          "`label:`): printed as given, after the paper's methods.")
        found.add(f"{len(labels)} method name(s) printed as given (config labels)", view)
    return found


def finish_warnings(out: Out, found: Warnings) -> Warnings:
    """`found` with the parts the report left out (`report:` lines) as one more kind."""
    skipped = [line.removeprefix("report: ") for line in out.lines if line.startswith("report: ")]
    if skipped:
        found.add(f"{len(skipped)} note(s) on parts left out or chosen",
                  frame_view(pd.DataFrame({"Note": skipped}), "What the report left out and why."))
    return found


def per_set_sections(out: Out, results: pd.DataFrame, scale: str) -> list[Section]:
    """Table 3 (methods x sets), the group averages and Table 4 (family x group). The page shows no value twice: the
    averages without the set columns of Table 3 (and only those that repeat no column: `new_averages`), Table 4 with
    the family means of `family_table` that repeat no column (`family_columns`); the files hold the full tables
    (per_set.*, families.*)."""
    layout, info = Layout.of(results), method_info(results)
    full = per_set_table(results, layout=layout)
    sets = [c for c in full.columns if c[0] in layout.sets]
    view3 = replace(per_set_view(full[sets], layout, scale, info), html_id=MAIN_TABLE)
    sections = [Section("Table 3: methods x OOD sets", [view3], out.tables("table3", [view3], grid_csv(full[sets])))]
    files = out.tables("per_set", [per_set_view(full, layout, scale, info)], grid_csv(full))
    averages = [c for c in full.columns if c[0] in new_averages(layout)]
    if averages:
        note = (f"Per method, the plain mean of its per-set values over each group's sets and over all sets: FPR@95 / "
                f"AUROC in percent. {scale_note(scale)}")
        sections.append(Section("Group averages", [grid_view(full[averages], ["Family", "Method"], note, flag=False)],
                                files))
    families = family_table(results, layout, full)
    table4 = family_group_table(results, layout, families)
    long = families.set_index(["family", "group"])
    shown = family_columns(layout)
    page4 = pd.DataFrame({(g, m): [long.loc[(f, g), m] for f in layout.families] for g in shown for m in CELL_METRICS},
                         index=pd.Index(list(layout.families), name="family"))
    page4.columns = pd.MultiIndex.from_tuples(list(page4.columns), names=["column", "metric"])
    note4 = (f"Family means (plain means over each family's own methods of per-set values), FPR@95 / AUROC in percent"
             f"{'; average: the mean of the group means' if 'average' in shown else ''}. {scale_note(scale)}")
    view4 = grid_view(table4, ["Family"], note4, flag=False)
    fam = frame_view(families,
                     f"Family means (plain means over methods of per-set values), in percent. {scale_note(scale)}")
    files4 = out.tables("sb_table4", [view4], grid_csv(table4)) + out.tables("families", [fam], families, latex=False)
    sections.append(Section("Table 4: family x group", [grid_view(page4, ["Family"], note4, flag=False)], files4))
    return sections


def new_averages(layout: Layout) -> list[str]:
    """The average columns that repeat no other column of the page: a group's when it holds two sets or more and not
    every set (else it is a set's column or the overall one), the overall one with two sets or more."""
    shown = [f"{g} avg" for g, sets in layout.groups.items() if 1 < len(sets) < len(layout.sets)]
    return shown + ([f"{ALL} avg"] if len(layout.sets) > 1 else [])


def family_columns(layout: Layout) -> list[str]:
    """Table 4's columns on the page: `all`, then each group and the mean of the group means when there are two
    groups or more (with one, both equal `all`)."""
    return [ALL, *layout.groups, "average"] if len(layout.groups) > 1 else [ALL]


def best_rule_section(out: Out, results: pd.DataFrame, scale: str, selection: pd.DataFrame | None) -> Section | None:
    """Per training method, the post-hoc rule chosen on validation (`rule_selection.csv`), on every test set."""
    if "base" not in results.columns or not (text_column(results["base"]) != "").any() or "rule" not in results.columns:
        return None
    best = best_rule_table(results, selection)
    if selection is None:
        note = (f"Rules were {NOT_SELECTED} (no rule_selection.csv beside the results): every rule of every training "
                f"method is listed, none is picked on test metrics. FPR@95 / AUROC in percent. {scale_note(scale)}")
    else:
        note = ("Per training method, the post-hoc rule chosen on validation (`chosen on`: the OOD-validation set and "
                f"metric), reported on every test set: FPR@95 / AUROC in percent. {scale_note(scale)}")
    view = grid_view(best, ["Base", "Rule", "Method", "Chosen on"], note)
    section = Section("Best rule per training method", [view], out.tables("best_rule", [view], grid_csv(best)))
    if selection is None:
        out.log(f"report: best rule: {NOT_SELECTED} (no rule_selection.csv); every rule listed")
    return section


def transfer_view(transfer: pd.DataFrame) -> View:
    """The threshold-transfer table, rates in percent, the species columns under their labels."""
    frame, scale = to_percent(transfer, TRANSFER_RATES)
    columns = [c for c in (*TRANSFER_COLUMNS, *SPECIES_COLUMNS) if c in frame.columns]
    frame = frame[columns].copy()
    for c in ("tp", "fp", "n_id", "n_ood", "n_novel_species"):
        if c in frame.columns:
            frame[c] = frame[c].astype("Int64").astype(object)
    note = ("Threshold chosen on `source` (flag OOD iff score < threshold), precision / recall of OOD and ID kept on "
            f"`target`, rates in percent. {scale_note(scale)}")
    labels = {c: COLUMN_LABELS[c] for c in SPECIES_COLUMNS if c in COLUMN_LABELS}
    return frame_view(frame, note, {"threshold": ".4g"}, labels)


def render_threshold_transfer(transfer: pd.DataFrame | str | os.PathLike) -> str:
    """The threshold-transfer table in markdown (`transfer_view`)."""
    return to_markdown(transfer_view(read_table(transfer, TRANSFER_REQUIRED, "threshold-transfer table")))


def transfer_section(out: Out, transfer: pd.DataFrame) -> Section:
    view = transfer_view(transfer)
    return Section("Threshold transfer", [view], out.tables("threshold_transfer", [view], latex=False))


def figure_section(out: Out, results: pd.DataFrame, fpr95: bool = True, heatmaps: bool = True,
                   collapsed: bool = False) -> Section:
    """FPR@95 by method grouped by family (with `fpr95`) and the AUROC / FPR@95 heatmaps (with `heatmaps`)."""
    layout = Layout.of(results)
    images = out.figure(plots.fpr95_figure, "fpr95_by_method", summary=method_summary(results), layout=layout) \
        if fpr95 else []
    if heatmaps:
        images += out.figure(plots.heatmap_figure, "heatmaps", table=per_set_table(results, averages=False),
                             layout=layout)
    title = "Figures: FPR@95 by family" + (", heatmaps" if heatmaps else "") if fpr95 else \
        "Heatmaps: AUROC and FPR@95 per method and set"
    return Section(title, images=images, collapsed=collapsed)


# -- from the per-sample scores ---------------------------------------------------------------------------------------
def _scores_of(rows: pd.DataFrame, role: str, ood_set: str | None = None) -> np.ndarray:
    mask = rows["role"] == role if ood_set is None else (rows["role"] == role) & (rows["ood_set"] == ood_set)
    return rows.loc[mask, "score"].to_numpy(np.float64)


def density_panels(rows: pd.DataFrame, method: str, aurocs: dict[tuple[str, str], float]) -> list[plots.Panel]:
    """A method's density panels: per test OOD set (ID test vs the set), then per field set (known vs novel rows)."""
    id_scores = _scores_of(rows, "id")
    out = [(s, id_scores, p["score"].to_numpy(np.float64), ("ID test", "OOD"), aurocs.get((method, s), np.nan))
           for s, p in rows[rows["role"] == "ood"].groupby("ood_set", sort=False)]
    for s, p in rows[rows["role"].isin(["field_id", "field_ood"])].groupby("ood_set", sort=False):
        known, novel = _scores_of(p, "field_id"), _scores_of(p, "field_ood")
        if len(novel):
            out.append((f"{s} (field)", known, novel, ("field known", "field novel"), aurocs.get((method, s), np.nan)))
    return out


def curves_section(out: Out, scores: pd.DataFrame, layout: Layout, paper: Paper | None = None,
                   collapsed: bool = False, aurocs: dict[tuple[str, str], float] | None = None) -> Section:
    """ROC curves (one panel per OOD set, the `ROC_METHODS` methods of best mean AUROC) and the score densities of
    every method (one row per method, one column per set), two figures; nothing is computed when figures are off."""
    section = Section("ROC curves and score densities", collapsed=collapsed)
    if not out.formats:
        return section
    by_method = {m: rows for m, rows in scores.groupby("method", sort=False)}
    methods = [m for m in layout.methods if m in by_method]
    sets = [s for s in layout.sets if s in set(scores.loc[scores["role"] == "ood", "ood_set"].unique())]
    aurocs = aurocs if aurocs is not None else per_set_auroc(scores)
    mean = {m: np.mean([aurocs[(m, s)] for s in sets if (m, s) in aurocs] or [np.nan]) for m in methods}
    best = sorted(methods, key=lambda m: (-mean[m] if np.isfinite(mean[m]) else np.inf))[:ROC_METHODS]
    shown = [m for m in methods if m in best]  # in the table's order
    panels = [(s, [(m, _scores_of(by_method[m], "id"), _scores_of(by_method[m], "ood", s), aurocs[(m, s)])
                   for m in shown if (m, s) in aurocs]) for s in sets]
    section.images += out.figure(plots.roc_figure, "roc", panels=[p for p in panels if p[1]], paper=paper)
    rows = [(m, density_panels(by_method[m], m, aurocs), plots.ScoreAxis.of(by_method[m])) for m in methods]
    section.images += out.figure(plots.densities_figure, "score_densities", rows=rows, paper=paper)
    section.wide.update(section.images)  # the ROC legend and the density rows' labels stay readable
    section.captions = {
        "roc.png": (f"ROC curves per OOD set (OOD positive: TPR = OOD detected, FPR = ID rejected) of the "
                    f"{len(shown)} method(s) of best mean AUROC (ties: the table's order; at most {ROC_METHODS}: more "
                    "curves on one panel cannot be told apart; every AUROC is in Table 3); AUROC in the legend."),
        "score_densities.png": (f"Score distributions per method (rows) and set (columns): ID test (black) against the "
                                f"set (red, dashed); each row's x axis spans the {plots.ROBUST[0]}-{plots.ROBUST[1]} "
                                "percentiles of the method's scores (a heavy-tailed method: the signed log distance "
                                "from its ID median, marked log).")}
    return section


def _interval_cell(row: pd.Series, metric: str) -> Cell:
    flag = metric == "auroc" and row[metric] < 50
    return (Part(f"{number(row[metric])} [{number(row[f'{metric}_lo'])}, {number(row[f'{metric}_hi'])}]", flag=flag),)


def interval_views(boot: pd.DataFrame, layout: Layout) -> list[View]:
    """AUROC and FPR@95 with their intervals: families x methods by sets."""
    indexed = boot.set_index(["method", "ood_set"])
    sets = [s for s in layout.sets if s in set(boot["ood_set"])]
    views = []
    for metric in ("auroc", "fpr95"):
        rows = []
        for family, method in layout.rows:
            if method in set(boot["method"]):
                rows.append(((family, method), [_interval_cell(indexed.loc[(method, s)], metric)
                                                if (method, s) in indexed.index else (Part(number(None)),)
                                                for s in sets]))
        n = int(boot["n_boot"].iloc[0])
        note = (f"{COLUMN_LABELS[metric]} in percent from the scores, with the 95% bootstrap interval ({n} replicates; "
                "ID and OOD scores resampled independently).")
        views.append(View(note, ["Family", "Method"], sets, rows, merge_first=True, title=COLUMN_LABELS[metric]))
    return views


def bootstrap_section(out: Out, scores: pd.DataFrame, layout: Layout, n: int, seed: int) -> Section:
    boot = bootstrap_table(scores, n, seed)
    views = interval_views(boot, layout)
    return Section("Bootstrap intervals", views, out.tables("bootstrap", views, boot))


def hop_section(out: Out, scores: pd.DataFrame) -> Section:
    """AUROC per taxonomic distance (hop) of the OOD species."""
    section = Section("AUROC by taxonomic distance (hop)")
    table = hop_table(scores)
    if table.empty:
        return out.skip(section, "no OOD row has a `hop` (1-3) in its manifest")
    wide = table.pivot_table(index=["ood_set", "method"], columns="distance", values="auroc", sort=False)
    counts = table.pivot_table(index="ood_set", columns="distance", values="n_ood", aggfunc="max", sort=False)
    order = [d for d in HOP_LABELS.values() if d in wide.columns]
    wide = wide[order].reset_index()
    note = ("AUROC in percent of ID test against the OOD images at each taxonomic distance from the ID species (same "
            "genus, same family, farther); `all` pools the OOD sets. Images per distance: " +
            "; ".join(f"{s}: " + ", ".join(f"{d} {number(counts.loc[s, d], '.0f')}"
                                           for d in order if d in counts.columns)
                      for s in counts.index))
    view = frame_view(wide, note)
    section.views.append(view)
    section.files = out.tables("hop_auroc", [view], table)
    return section


def species_section(out: Out, scores: pd.DataFrame, transfer: pd.DataFrame | None) -> Section:
    """Open-Insects' Table 6: per novel species of a field set, images flagged at the transferred threshold."""
    section = Section("Field report per novel species")
    if transfer is None:
        return out.skip(section, "needs threshold_transfer.csv (the transferred thresholds)")
    per_species = species_field_table(scores, transfer)
    if per_species.empty:
        return out.skip(section, "no field set with species among the transfer targets")
    summary = species_summary(per_species)
    labels = {"images_flagged": "images flagged (%)", "any": "species with >= 1 flagged (%)",
              "majority": "species with a majority flagged (%)"}
    views = [frame_view(summary, "Per method: novel species and images of the field set, and how many are flagged at "
                        "the threshold transferred from `source` (flag OOD iff score < threshold).",
                        {"species": ".0f", "images": ".0f", "flagged": ".0f"}, labels)]
    for (source, target), part in per_species.groupby(["source", "target"], sort=False):
        matrix = part.pivot_table(index=["species", "images"], columns="method", values="flagged", sort=False)
        matrix = matrix.astype("Int64").astype(object).reset_index()
        views.append(frame_view(matrix, f"Images flagged per novel species of {target} (threshold from {source}).",
                                {"images": ".0f"}))
    section.views += views
    section.files = out.tables("species_field", views, per_species)
    if "path" in scores.columns:
        section.images += field_sheets(out, scores, transfer, "field_sheet")
        section.wide.update(section.images)
    return section


def field_sheets(out: Out, scores: pd.DataFrame, transfer: pd.DataFrame, stem: str, name: str = "",
                 per_species: int = 4, paper: Paper | None = None) -> list[str]:
    """Open-Insects Figure 3 per field set among the transfer targets: up to `per_species` images of each novel species
    for the transfer row of best recall (ties: higher precision, then the first row), each marked flagged (score <
    its threshold) or missed. `scores` carries `species` and `path` (`attach_metadata`); sheets are
    `<stem>_<target>.png`."""
    images = []
    novel_rows = scores[(scores["role"] == "field_ood") & scores["species"].notna()]
    for target, rules in (transfer[transfer["target"].isin(novel_rows["ood_set"].unique())]
                          .groupby("target", sort=False)):
        rule = rules.sort_values(["recall", "precision"], ascending=False, kind="mergesort").iloc[0]
        novel = novel_rows[(novel_rows["ood_set"] == target) & (novel_rows["method"] == rule["method"])]
        if novel.empty:
            continue
        novel = novel.assign(flagged=novel["score"] < float(rule["threshold"]))
        shown = novel.groupby("species", sort=False, group_keys=False).head(per_species)
        title = (f"{name + ', ' if name else ''}{target}: novel-species images, {method_label(rule['method'], paper)} "
                 f"at the threshold from {rule['source']} (red frame: flagged; grey: missed)")
        images += out.figure(plots.field_sheet, f"{stem}_{target}", photo=True, rows=shown, title=title)
    return images


def id_looking_section(out: Out, scores: pd.DataFrame, k: int, aurocs: dict[tuple[str, str], float] | None = None,
                       paper: Paper | None = None) -> Section:
    """Per OOD set, the k most ID-looking OOD images of each method: a thumbnail sheet on the page, the table in
    id_looking.{md,csv}. `aurocs`: `per_set_auroc(scores)` when already computed."""
    section = Section("Most ID-looking OOD images")
    if not has_sources(scores):
        return out.skip(section, "needs the `file_name` and `manifest` columns in scores.parquet (newer runs)")
    table = id_looking_table(scores[scores["role"].isin(["id", "ood"])], k)
    if table.empty:
        return out.skip(section, "no test OOD rows")
    aurocs = aurocs if aurocs is not None else per_set_auroc(scores)
    for ood_set, part in table.groupby("ood_set", sort=False):
        best = sorted(dict.fromkeys(part["method"]), key=lambda m: -aurocs[(m, ood_set)])[:SHEET_METHODS]
        shown = part[part["method"].isin(best)].sort_values("method", key=lambda c: c.map(best.index), kind="mergesort")
        note = f" ({SHEET_METHODS} methods of best AUROC)" if len(best) < part["method"].nunique() else ""
        section.images += out.figure(plots.id_looking_sheet, f"id_looking_{ood_set}", photo=True, rows=shown,
                                     ood_set=ood_set, note=note, paper=paper)
    section.wide.update(section.images)  # thumbnails and captions at their own size
    shown = table.drop(columns=[c for c in ("path", "manifest") if c in table.columns])
    shown = shown[[c for c in ("ood_set", "method", "rank", "score", "id_share", "species", "file_name") if c in shown]]
    view = frame_view(shown, f"Per OOD set and method, the {k} OOD images with the highest scores (most ID-looking); "
                      "`id_share`: percent of ID test scores below the image's score.", {"rank": ".0f", "score": ".4g"})
    section.files = out.tables("id_looking", [view], table.drop(columns=["path"]), latex=False)
    return section


def with_metadata(scores: pd.DataFrame, run_dir: Path | None) -> pd.DataFrame | None:
    """`scores` with `hop`, `species` and `path` from the manifests, or None when the rows do not name them."""
    return attach_metadata(scores, ["hop", "species"], run_dir) if has_sources(scores) else None


__all__ = ["Out", "grid_csv", "Warnings", "low_auroc_view", "collect_warnings", "finish_warnings", "per_set_sections",
           "new_averages", "family_columns",
           "best_rule_section", "transfer_view",
           "render_threshold_transfer", "transfer_section", "figure_section", "curves_section", "interval_views",
           "bootstrap_section", "hop_section", "species_section", "field_sheets", "id_looking_section", "with_metadata"]
