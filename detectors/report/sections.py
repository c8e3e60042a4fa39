"""The report's sections: each builds its tables and figures, writes them through `Out` and returns the `Section`
that `index.html` shows."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

import numpy as np

from detectors.report import plots
from detectors.report.figures import Job
from detectors.report.html import Section
from detectors.report.names import method_label
from detectors.report.render import (Cell, Part, View, frame_view, grid_view, number, per_set_view, scale_note, to_latex,
                                     to_markdown)
from detectors.report.scores import (HOP_LABELS, attach_metadata, bootstrap_table, has_sources, hop_table,
                                     id_looking_table, per_set_auroc, species_field_table, species_summary)
from detectors.report.tables import (NOT_SELECTED, Layout, best_rule_table, family_group_table, family_table, low_auroc,
                                     method_info, method_summary, per_set_table, read_table, text_column, to_percent)
from detectors.tables import COLUMN_LABELS, SPECIES_COLUMNS, TRANSFER_COLUMNS, TRANSFER_RATES
from pipelines.io import atomic_write_text, safe_name

TRANSFER_REQUIRED = tuple(c for c in TRANSFER_COLUMNS if c != "tpr")
"""Threshold-transfer columns every table has (older tables lack `tpr` and the species columns)."""
SHEET_METHODS = 12
"""At most this many methods (those of best AUROC on the set) get a row in a set's thumbnail sheet."""


@dataclass
class Out:
    """The report folder: writes files atomically and remembers them; queues figures (`jobs`, rendered together by
    `figures.render`) unless `formats` is empty; `log` gets one line per skipped part."""

    folder: Path
    log: Callable[[str], None] = lambda line: None
    formats: tuple[str, ...] = ("png",)
    written: list[Path] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)

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

    def figure(self, build: Callable[..., Any], stem: str, **kwargs: Any) -> list[str]:
        """Queue `build(**kwargs)` as `<stem>.png` (and the other formats); returns [the PNG's name], or [] when
        figures are off."""
        if not self.formats:
            return []
        path = self.folder / f"{safe_name(stem)}.png"
        self.jobs.append(Job(build, path, kwargs))
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
def warnings_section(out: Out, results: pd.DataFrame) -> Section:
    """Every (method, set) whose AUROC is below 50, listed first."""
    section = Section("Warnings")
    low = low_auroc(results)
    if low.empty:
        section.text.append("No OOD set has an AUROC below 50.")
        return section
    section.text.append(f"{len(low)} (method, set) pair(s) with AUROC below 50: the detector scores these OOD images as "
                        "more in-distribution than the ID test images (e.g. the classifier confidently calls them an "
                        "ID class). Group means hide this.")
    section.views.append(frame_view(low, labels={"auroc": "AUROC"}))
    return section


def per_set_sections(out: Out, results: pd.DataFrame, scale: str) -> list[Section]:
    """Table 3 (methods x sets), the per-set table with averages, Table 4 (family x group) and the family means."""
    layout, info = Layout.of(results), method_info(results)
    sections = []
    for title, stem, averages in (("Table 3: methods x OOD sets", "table3", False),
                                  ("Per set with group averages", "per_set", True)):
        table = per_set_table(results, averages=averages)
        view = per_set_view(table, layout, scale, info)
        sections.append(Section(title, [view], out.tables(stem, [view], grid_csv(table))))
    table4, families = family_group_table(results), family_table(results)
    note4 = (f"Family means (plain means over each family's own methods of per-set values), FPR@95 / AUROC in percent. "
             f"{scale_note(scale)}")
    view4 = grid_view(table4, ["Family"], note4, flag=False)
    fam = frame_view(families, f"Family means (plain means over methods of per-set values), in percent. {scale_note(scale)}")
    files = out.tables("sb_table4", [view4], grid_csv(table4)) + out.tables("families", [fam], families, latex=False)
    sections.append(Section("Table 4: family x group", [view4, fam], files))
    return sections


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


def figure_section(out: Out, results: pd.DataFrame, fpr95: bool = True) -> Section:
    """Figure 5 (FPR@95 grouped by family; with `fpr95`) and the AUROC / FPR@95 heatmaps."""
    layout = Layout.of(results)
    table3 = per_set_table(results, averages=False)
    images = out.figure(plots.fpr95_figure, "fpr95_by_method", summary=method_summary(results), layout=layout) \
        if fpr95 else []
    for metric in ("auroc", "fpr95"):
        images += out.figure(plots.heatmap_figure, f"heatmap_{metric}", table=table3, layout=layout, metric=metric)
    return Section("Figures: FPR@95 by family, heatmaps", images=images)


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


def curves_section(out: Out, scores: pd.DataFrame, layout: Layout) -> Section:
    """ROC curves per OOD set and score densities per method (nothing is computed when figures are off)."""
    if not out.formats:
        return Section("ROC curves and score densities")
    by_method = {m: rows for m, rows in scores.groupby("method", sort=False)}
    methods = [m for m in layout.methods if m in by_method]
    sets = [s for s in layout.sets if s in set(scores.loc[scores["role"] == "ood", "ood_set"].unique())]
    aurocs = per_set_auroc(scores)
    images = []
    for s in sets:
        curves = [(m, _scores_of(by_method[m], "id"), _scores_of(by_method[m], "ood", s), aurocs[(m, s)])
                  for m in methods if (m, s) in aurocs]
        images += out.figure(plots.roc_figure, f"roc_{s}", curves=curves, ood_set=s)
    for m in methods:
        rows = by_method[m]
        images += out.figure(plots.density_figure, f"score_density_{m}", method=m,
                             panels=density_panels(rows, m, aurocs), axis=plots.ScoreAxis.of(rows))
    return Section("ROC curves and score densities", images=images)


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
                                                if (method, s) in indexed.index else (Part(number(None)),) for s in sets]))
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
            "; ".join(f"{s}: " + ", ".join(f"{d} {number(counts.loc[s, d], '.0f')}" for d in order if d in counts.columns)
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
    return section


def field_sheets(out: Out, scores: pd.DataFrame, transfer: pd.DataFrame, stem: str, name: str = "",
                 per_species: int = 4) -> list[str]:
    """Open-Insects Figure 3 per field set among the transfer targets: up to `per_species` images of each novel species
    for the transfer row of best recall, each marked flagged (score < its threshold) or missed. `scores` carries
    `species` and `path` (`attach_metadata`); sheets are `<stem>_<target>.png`."""
    images = []
    novel_rows = scores[(scores["role"] == "field_ood") & scores["species"].notna()]
    for target, rules in transfer[transfer["target"].isin(novel_rows["ood_set"].unique())].groupby("target", sort=False):
        rule = rules.sort_values("recall", ascending=False, kind="mergesort").iloc[0]
        novel = novel_rows[(novel_rows["ood_set"] == target) & (novel_rows["method"] == rule["method"])]
        if novel.empty:
            continue
        novel = novel.assign(flagged=novel["score"] < float(rule["threshold"]))
        shown = novel.groupby("species", sort=False, group_keys=False).head(per_species)
        title = (f"{name + ', ' if name else ''}{target}: novel-species images, {method_label(rule['method'])} at the "
                 f"threshold from {rule['source']} (red frame: flagged; grey: missed)")
        images += out.figure(plots.field_sheet, f"{stem}_{target}", rows=shown, title=title)
    return images


def id_looking_section(out: Out, scores: pd.DataFrame, k: int) -> Section:
    """Per OOD set, the k most ID-looking OOD images of each method, as a table and a thumbnail sheet."""
    section = Section("Most ID-looking OOD images")
    if not has_sources(scores):
        return out.skip(section, "needs the `file_name` and `manifest` columns in scores.parquet (newer runs)")
    table = id_looking_table(scores[scores["role"].isin(["id", "ood"])], k)
    if table.empty:
        return out.skip(section, "no test OOD rows")
    aurocs = per_set_auroc(scores)
    for ood_set, part in table.groupby("ood_set", sort=False):
        best = sorted(dict.fromkeys(part["method"]), key=lambda m: -aurocs[(m, ood_set)])[:SHEET_METHODS]
        shown = part[part["method"].isin(best)].sort_values("method", key=lambda c: c.map(best.index), kind="mergesort")
        note = f" ({SHEET_METHODS} methods of best AUROC)" if len(best) < part["method"].nunique() else ""
        section.images += out.figure(plots.id_looking_sheet, f"id_looking_{ood_set}", rows=shown,
                                     ood_set=ood_set + note)
    shown = table.drop(columns=[c for c in ("path", "manifest") if c in table.columns])
    shown = shown[[c for c in ("ood_set", "method", "rank", "score", "id_share", "species", "file_name") if c in shown]]
    view = frame_view(shown, f"Per OOD set and method, the {k} OOD images with the highest scores (most ID-looking); "
                      "`id_share`: percent of ID test scores below the image's score.", {"rank": ".0f", "score": ".4g"})
    section.views.append(view)
    section.files = out.tables("id_looking", [view], table.drop(columns=["path"]), latex=False)
    return section


def with_metadata(scores: pd.DataFrame, run_dir: Path | None) -> pd.DataFrame | None:
    """`scores` with `hop`, `species` and `path` from the manifests, or None when the rows do not name them."""
    return attach_metadata(scores, ["hop", "species"], run_dir) if has_sources(scores) else None


__all__ = ["Out", "grid_csv", "warnings_section", "per_set_sections", "best_rule_section", "transfer_view",
           "render_threshold_transfer", "transfer_section", "figure_section", "curves_section", "interval_views",
           "bootstrap_section", "hop_section", "species_section", "field_sheets", "id_looking_section", "with_metadata"]
