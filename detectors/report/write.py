"""The whole report: every table, figure and `index.html` of a run (or, for Open-Insects, of one run per region), from
the results tables and their companion files.

Tables and the page are written in the calling process; figures are queued while the tables are built and rendered
together in worker processes (`figures.render`) before the page is written.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from detectors.report.figures import render
from detectors.report.html import Section, index_html
from detectors.report.papers import Run, open_insects_sections, region_name, shiftedbronzes_sections
from detectors.report.scores import has_sources, read_scores
from detectors.report.sections import (TRANSFER_REQUIRED, Out, best_rule_section, bootstrap_section, curves_section,
                                       figure_section, hop_section, id_looking_section, per_set_sections,
                                       species_section, transfer_section, warnings_section, with_metadata)
from detectors.report.tables import Layout, read_results, read_rule_selection, read_table, select_methods
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
                    seed: int, top_k: int, run_dir: Path | None) -> list[Section]:
    sections = [curves_section(out, scores, layout)]
    if bootstrap:
        sections.append(bootstrap_section(out, scores, layout, bootstrap, seed))
    if not has_sources(scores):
        out.log("report: scores.parquet has no file_name / manifest columns (older run): no AUROC by hop, field report "
                "per species or ID-looking images")
        return sections
    enriched = with_metadata(scores, run_dir)
    sections += [hop_section(out, enriched), species_section(out, enriched, transfer)]
    if top_k:
        sections.append(id_looking_section(out, enriched, top_k))
    return sections


def _finish(out: Out, title: str, sections: list[Section], workers: int | None) -> list[Path]:
    """Render the queued figures, drop the ones that failed (and the sections left empty: no 'not applicable' in the
    page or its contents), link the PDFs, write index.html."""
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
        out.log(f"report: {len(made)} figure(s) in {time.perf_counter() - started:.1f} s")
    shown = [s for s in sections if s.views or s.images or s.files or s.text]
    out.text("index.html", index_html(title, shown))
    return out.written


def _out(out_dir: str | os.PathLike, figures: str, log: Callable[[str], None] | None) -> Out:
    if figures not in FIGURES:
        raise UserInputError(f"--figures: one of {list(FIGURES)}, got {figures!r}")
    out = Out(Path(out_dir), log or (lambda line: None), FIGURES[figures])
    out.folder.mkdir(parents=True, exist_ok=True)
    return out


def write_report(results: Table, out_dir: str | os.PathLike, *, methods: Sequence[str] | None = None,
                 scores: Table | None = None, threshold_transfer: Table | None = None,
                 rule_selection: Table | None = None, bootstrap: int = 0, seed: int = 0, top_k: int = 8,
                 run_dir: str | os.PathLike | None = None, log: Callable[[str], None] | None = None,
                 layout: str = "generic", figures: str = "png", classifier: str | os.PathLike | None = None,
                 fewshot: str | os.PathLike | None = None, feature_maps: str | os.PathLike | None = None,
                 workers: int | None = None) -> list[Path]:
    """Write every table and figure of the report under `out_dir`, and `index.html` showing them all; returns the
    paths written (index.html last). `layout` `generic` or `shiftedbronzes` (Open-Insects: `write_open_insects`).

    From the results: table3 / per_set / sb_table4 .{md,tex,csv}, families.{md,csv}, best_rule.{md,tex,csv} (rows
    with a `base`; the rule chosen in `rule_selection`, none picked without it), fpr95_by_method.png,
    heatmap_{auroc,fpr95}.png. With `threshold_transfer`: threshold_transfer.{md}. With `scores`: roc_<set>.png,
    score_density_<method>.png, bootstrap.{md,tex,csv} (`bootstrap` replicates, seeded by `seed`), and, when the
    scores name their images (file_name, manifest): hop_auroc.*, species_field.* (field sets, with the transfer
    table), id_looking.{md,csv} and id_looking_<set>.png (`top_k` images). `shiftedbronzes` replaces Table 3 / 4 and
    Figure 5 by the paper's (sb_table2 from `classifier`'s metrics.json, sb_table3, sb_table4, sb_figure5, 6, 7 from
    `fewshot`, 2(c) from `feature_maps`). `figures`: `png`, `pdf` (also a PDF of each) or `none`; `workers`: figure
    processes (default: the CPUs). `methods` restricts the report; `log` receives a line per skipped part.
    """
    if layout not in ("generic", "shiftedbronzes"):
        raise UserInputError(f"--layout: {layout!r} here; one of {list(LAYOUTS)} (open-insects: write_open_insects)")
    out = _out(out_dir, figures, log)
    frame, scale = read_results(results)
    frame = select_methods(frame, methods)
    order = Layout.of(frame)
    selection = read_rule_selection(rule_selection) if rule_selection is not None else None
    transfer = None
    if threshold_transfer is not None:
        transfer = _restricted(read_table(threshold_transfer, TRANSFER_REQUIRED, "threshold-transfer table"), methods)
    found = _restricted(read_scores(scores), order.methods) if scores is not None else None
    sections = [warnings_section(out, frame)]
    if layout == "shiftedbronzes":
        sections += shiftedbronzes_sections(out, frame, scale, found, Path(classifier) if classifier else None,
                                            Path(fewshot) if fewshot else None,
                                            Path(feature_maps) if feature_maps else None)
    else:
        sections += per_set_sections(out, frame, scale)
    best = best_rule_section(out, frame, scale, selection)
    sections += [best] if best is not None else []
    sections += [transfer_section(out, transfer)] if transfer is not None else []
    sections.append(figure_section(out, frame, fpr95=layout != "shiftedbronzes"))
    if found is not None:
        where = Path(run_dir) if run_dir is not None else _run_dir(scores, results)
        sections += _score_sections(out, found, order, transfer, bootstrap, seed, top_k, where)
    elif bootstrap:
        out.log("report: --bootstrap needs the scores table (scores.parquet)")
    title = f"OOD detection report: {len(order.methods)} method(s), {len(order.sets)} OOD set(s)"
    return _finish(out, title, sections, workers)


def write_open_insects(results: Sequence[str | tuple[str, str | os.PathLike]], out_dir: str | os.PathLike, *,
                       splits: str | os.PathLike | None = None, figures: str = "png",
                       log: Callable[[str], None] | None = None, workers: int | None = None) -> list[Path]:
    """Open-Insects' tables and figures from one run per region (`results`: results-table paths, or (region, path);
    a bare path is named by its run folder), each with its companion files: table2 (Table 2/7), table4 (threshold
    transfer), table5 (from `splits`' summary and region manifests), table6, figure1, figure3_<region>_<set>."""
    out = _out(out_dir, figures, log)
    specs = [region_name(str(r)) if not isinstance(r, tuple) else (r[0], Path(r[1])) for r in results]
    names = [n for n, _ in specs]
    if len(set(names)) < len(names):
        raise UserInputError(f"--results: region names {names} repeat; name them NAME=PATH")
    runs = [Run.read(name, path) for name, path in specs]
    sections = [warnings_section(out, pd.concat([r.results.assign(ood_set=r.name + ": " + r.results["ood_set"])
                                                 for r in runs], ignore_index=True))]
    sections += open_insects_sections(out, runs, Path(splits) if splits is not None else None)
    title = f"Open-Insects report: {len(runs)} region(s) ({', '.join(names)})"
    return _finish(out, title, sections, workers)


__all__ = ["LAYOUTS", "FIGURES", "write_report", "write_open_insects"]
