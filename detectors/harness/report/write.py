"""The whole report: every table, figure and `index.html` of a run (or, for Open-Insects, of one run per region), from
the results tables and their companion files.

Tables and the page are written in the calling process; figures are queued while the tables are built and rendered
together (`figures.render`: in worker processes when that pays) before the page is written. Only what the layout
needs is drawn: a paper layout the paper's figures; the generic layout FPR@95 by family, ROC curves, score densities
and the most ID-looking images; `diagnostics` adds the heatmaps (a coloured Table 3) and, in a paper layout, the generic
figures and score tables.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from detectors.harness.report.figures import render
from detectors.harness.report.html import Section, index_html
from detectors.harness.report.names import OPEN_INSECTS, SHIFTED_BRONZES, Paper, region_label, unknown_methods
from detectors.harness.report.open_insects import open_insects_sections, table_methods
from detectors.harness.report.openset import openset_section
from detectors.harness.report.papers import Run, region_name
from detectors.harness.report.render import CONVENTIONS
from detectors.harness.report.scores import has_sources, per_set_auroc, read_scores
from detectors.harness.report.sections import (
    TRANSFER_REQUIRED,
    Out,
    Warnings,
    best_rule_section,
    bootstrap_section,
    collect_warnings,
    curves_section,
    figure_section,
    finish_warnings,
    hop_section,
    id_looking_section,
    per_set_sections,
    species_section,
    transfer_section,
    with_metadata,
)
from detectors.harness.report.shiftedbronzes import layout_of, shiftedbronzes_sections
from detectors.harness.report.tables import Layout, read_results, read_rule_selection, read_table, select_methods
from pipelines.errors import UserInputError

Table = pd.DataFrame | str | os.PathLike
LAYOUTS = ("generic", "open-insects", "shiftedbronzes")
FIGURES = {"png": ("png",), "pdf": ("png", "pdf"), "none": ()}
"""`--figures`: PNG (the page's), PNG and a publication PDF of each, or no figures."""


def _run_dir(*sources: Table | None) -> Path | None:
    """The run folder: that of the first source given as a path (relative manifests are read from it)."""
    return next((Path(s).parent for s in sources if s is not None and not isinstance(s, pd.DataFrame)), None)


def _restricted(frame: pd.DataFrame, methods: Sequence[str] | None) -> pd.DataFrame:
    return frame[frame["method"].astype(str).isin(methods)] if methods else frame


def _score_sections(out: Out, scores: pd.DataFrame, layout: Layout, transfer: pd.DataFrame | None, bootstrap: int,
                    seed: int, top_k: int, run_dir: Path | None, diagnostics: bool, paper: Paper | None,
                    collapsed: bool) -> list[Section]:
    aurocs = per_set_auroc(scores) if diagnostics else {}
    sections = [curves_section(out, scores, layout, paper, collapsed, aurocs)] if diagnostics else []
    if bootstrap:
        sections.append(bootstrap_section(out, scores, layout, bootstrap, seed))
    if not diagnostics:
        return sections
    if not has_sources(scores):
        out.log("report: scores.parquet has no file_name / manifest columns (older run): no AUROC by hop, field report "
                "per species or ID-looking images")
        return sections
    enriched = with_metadata(scores, run_dir)
    if "hop" in enriched.columns and enriched["hop"].notna().any():  # no note about data the run does not have
        sections.append(hop_section(out, enriched))
    if transfer is not None:
        sections.append(species_section(out, enriched, transfer))
    if top_k:
        sections.append(id_looking_section(out, enriched, top_k, aurocs, paper))
    return sections


def _finish(out: Out, title: str, sections: list[Section], workers: int | None, warnings: Warnings) -> list[Path]:
    """Render the queued figures, drop the ones that failed (and the sections left empty: no 'not applicable' in the
    page or its contents), link the PDFs, add the warnings (a count per kind at the top, details at the end and in
    warnings.md), write index.html."""
    started = time.perf_counter()
    made = {p.name for p in render(out.jobs, out.formats, workers, out.log)}
    out.written += [out.folder / n for n in made]
    if "pdf" in out.formats:
        out.written += [(out.folder / n).with_suffix(".pdf") for n in made]
    for section in sections:
        section.images = [i for i in section.images if i in made]
        if "pdf" in out.formats:
            section.files += [str(Path(i).with_suffix(".pdf")) for i in section.images]
    if out.jobs:
        out.sink(f"report: {len(made)} figure(s) in {time.perf_counter() - started:.1f} s")
    details = finish_warnings(out, warnings).section(out)
    shown = [s for s in sections if s.views or s.images or s.files or s.text] + ([details] if details else [])
    out.text("index.html", index_html(title, shown, CONVENTIONS, warnings.summary))
    return out.written


def _out(out_dir: str | os.PathLike, figures: str, log: Callable[[str], None] | None) -> Out:
    if figures not in FIGURES:
        raise UserInputError(f"--figures: one of {list(FIGURES)}, got {figures!r}")
    out = Out(Path(out_dir), log or (lambda line: None), FIGURES[figures])
    out.folder.mkdir(parents=True, exist_ok=True)
    return out


def _classifiers(classifier: str | os.PathLike | Sequence[str | os.PathLike] | None) -> list[str | os.PathLike]:
    if classifier is None:
        return []
    return [classifier] if isinstance(classifier, (str, os.PathLike)) else list(classifier)


def _label_notes(out: Out, results: pd.DataFrame) -> None:
    names = unknown_methods(results["method"])
    if names:
        out.sink(f"report: {len(names)} method name(s) are no registered method (config labels), printed as given: "
                 f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")


def write_report(results: Table, out_dir: str | os.PathLike, *, methods: Sequence[str] | None = None,
                 scores: Table | None = None, threshold_transfer: Table | None = None,
                 rule_selection: Table | None = None, bootstrap: int = 0, seed: int = 0, top_k: int = 8,
                 run_dir: str | os.PathLike | None = None, log: Callable[[str], None] | None = None,
                 layout: str = "generic", figures: str = "png",
                 classifier: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                 fewshot: str | os.PathLike | None = None, feature_maps: str | os.PathLike | None = None,
                 workers: int | None = None, diagnostics: bool = False, openset: bool = False) -> list[Path]:
    """Write every table and figure of the report under `out_dir`, and `index.html` showing them all; returns the
    paths written (index.html last). `layout` `generic` or `shiftedbronzes` (Open-Insects: `write_open_insects`).

    Generic, from the results: table3 / per_set / sb_table4 .{md,tex,csv}, families.{md,csv}, best_rule.{md,tex,csv}
    (rows with a `base`; the rule chosen in `rule_selection`, none picked without it), fpr95_by_method.png (and
    heatmaps.png with `diagnostics`). With `threshold_transfer`: threshold_transfer.md. With `scores`: roc.png,
    score_densities.png, bootstrap.{md,tex,csv} (`bootstrap` replicates, seeded by `seed`), and, when the scores name
    their images (file_name, manifest): hop_auroc.*, species_field.* (field sets, with the transfer table),
    id_looking.{md,csv} and id_looking_<set>.png (`top_k` images). `shiftedbronzes` writes the paper's Tables 3, 4, 2
    (sb_table3, sb_table4, sb_table2 from `classifier`: one or more classifier folders, `NAME=PATH` or `PATH`) and
    Figures 5, 6, 7 (`fewshot`), 2(c) (`feature_maps`); `diagnostics` adds the heatmaps and, there, the generic
    figures and score tables. `openset` adds openset.{md,csv}: the Open-Insect evaluator's ood.csv columns
    (`detectors.harness.report.openset`). `figures`: `png`, `pdf` (also a PDF of each) or `none`; `workers`: figure
    processes (default: the CPUs, used when it pays). `methods` restricts the report; `log` receives a line per
    skipped part. Warnings (AUROC below 50, config labels, parts left out) are counted at the top of the page.
    """
    if layout not in ("generic", "shiftedbronzes"):
        raise UserInputError(f"--layout: {layout!r} here; one of {list(LAYOUTS)} (open-insects: write_open_insects)")
    paper = SHIFTED_BRONZES if layout == "shiftedbronzes" else None
    extras = paper is None or bool(diagnostics)
    out = _out(out_dir, figures, log)
    frame, scale = read_results(results)
    frame = select_methods(frame, methods)
    order = layout_of(frame) if paper else Layout.of(frame)
    selection = read_rule_selection(rule_selection) if rule_selection is not None else None
    transfer = None
    if threshold_transfer is not None:
        transfer = _restricted(read_table(threshold_transfer, TRANSFER_REQUIRED, "threshold-transfer table"), methods)
    found = _restricted(read_scores(scores), order.methods) if scores is not None else None
    if paper is not None:
        _label_notes(out, frame)
    warnings = collect_warnings(out, frame, paper)
    if paper is not None:
        sections = shiftedbronzes_sections(out, frame, scale, found, _classifiers(classifier),
                                           Path(fewshot) if fewshot else None,
                                           Path(feature_maps) if feature_maps else None)
    else:
        sections = per_set_sections(out, frame, scale)
    best = best_rule_section(out, frame, scale, selection)
    sections += [best] if best is not None else []
    sections += [transfer_section(out, transfer)] if transfer is not None else []
    found_openset = openset_section(out, frame) if openset else None
    sections += [found_openset] if found_openset is not None else []
    if extras:
        sections.append(figure_section(out, frame, fpr95=paper is None, heatmaps=bool(diagnostics),
                                       collapsed=paper is not None))
    if found is not None:
        where = Path(run_dir) if run_dir is not None else _run_dir(scores, results)
        sections += _score_sections(out, found, order, transfer, bootstrap, seed, top_k, where, extras, paper,
                                    collapsed=paper is not None)
    elif bootstrap:
        out.log("report: --bootstrap needs the scores table (scores.parquet)")
    name = f"{paper.name} report" if paper else "OOD detection report"
    title = f"{name}: {len(order.methods)} method(s), {len(order.sets)} OOD set(s)"
    return _finish(out, title, sections, workers, warnings)


def write_open_insects(results: Sequence[str | tuple[str, str | os.PathLike]], out_dir: str | os.PathLike, *,
                       splits: str | os.PathLike | None = None, figures: str = "png",
                       log: Callable[[str], None] | None = None, workers: int | None = None,
                       pretrained: Sequence[str] = (), aux_study: str | os.PathLike | None = None,
                       openset: bool = False) -> list[Path]:
    """Open-Insects' tables and figures from one run per region (`results`: results-table paths, or (region, path);
    a bare path is named by its run folder), each with its companion files: table2 (Tables 2 / 7: the runs named in
    `pretrained` started from ImageNet-1K weights and form Table 7), table4 (threshold transfer), table5 (from
    `splits`' summary and region manifests), table6, figure1, figure3_<region>_<set>, figure4 (from `aux_study`,
    scripts/aux_study.py's folder); `openset` adds openset_<region>.{md,csv} per region (the Open-Insect
    evaluator's ood.csv columns; Table 2 stays as the paper prints it)."""
    out = _out(out_dir, figures, log)
    specs = [region_name(str(r)) if not isinstance(r, tuple) else (r[0], Path(r[1])) for r in results]
    names = [n for n, _ in specs]
    if len(set(names)) < len(names):
        raise UserInputError(f"--results: region names {names} repeat; name them NAME=PATH")
    unknown = sorted(set(pretrained) - set(names))
    if unknown:
        raise UserInputError(f"--pretrained: {unknown} name no run of --results (runs: {names})")
    runs = [Run.read(name, path, pretrained=name in set(pretrained)) for name, path in specs]
    shown = table_methods(runs)
    rows = pd.concat([r.results[r.results["method"].isin(shown[r.name])].assign(region=r.name) for r in runs],
                     ignore_index=True)
    _label_notes(out, rows)
    warnings = collect_warnings(out, rows, OPEN_INSECTS)
    sections = open_insects_sections(out, runs, Path(splits) if splits is not None else None,
                                     Path(aux_study) if aux_study is not None else None)
    if openset:
        sections += [s for s in (openset_section(out, r.results, r.name) for r in runs) if s is not None]
    title = f"Open-Insects report: {len(runs)} region(s) ({', '.join(map(region_label, names))})"
    return _finish(out, title, sections, workers, warnings)


__all__ = ["LAYOUTS", "FIGURES", "write_report", "write_open_insects"]
