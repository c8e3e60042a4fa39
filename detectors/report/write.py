"""The whole report: every table, figure and `index.html` of a run, from its results table and companion files."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from detectors.report.html import Section, index_html
from detectors.report.scores import read_scores
from detectors.report.sections import (TRANSFER_REQUIRED, Out, best_rule_section, bootstrap_section, curves_section,
                                       figure_section, hop_section, id_looking_section, per_set_sections,
                                       species_section, transfer_section, warnings_section, with_metadata)
from detectors.report.tables import Layout, read_results, read_rule_selection, read_table, select_methods

Table = pd.DataFrame | str | os.PathLike
COMPANIONS = {"scores": "scores.parquet", "threshold_transfer": "threshold_transfer.csv",
              "rule_selection": "rule_selection.csv"}


def companion_files(results_path: str | os.PathLike) -> dict[str, Path]:
    """Files the runner writes beside the results table and that exist: `scores`, `threshold_transfer`,
    `rule_selection`."""
    folder = Path(results_path).parent
    return {k: folder / name for k, name in COMPANIONS.items() if (folder / name).is_file()}


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
    enriched = with_metadata(scores, run_dir)
    if enriched is None:
        skipped = Section("Species and images")
        return [*sections, out.skip(skipped, "scores.parquet has no file_name / manifest columns (older run): no AUROC "
                                             "by hop, field report per species or ID-looking images")]
    sections += [hop_section(out, enriched), species_section(out, enriched, transfer)]
    if top_k:
        sections.append(id_looking_section(out, enriched, top_k))
    return sections


def write_report(results: Table, out_dir: str | os.PathLike, *, methods: Sequence[str] | None = None,
                 scores: Table | None = None, threshold_transfer: Table | None = None,
                 rule_selection: Table | None = None, bootstrap: int = 0, seed: int = 0, top_k: int = 8,
                 run_dir: str | os.PathLike | None = None, log: Callable[[str], None] | None = None) -> list[Path]:
    """Write every table and figure of the report under `out_dir`, and `index.html` showing them all; returns the
    paths written (index.html last).

    From the results: table3 / per_set / table4 .{md,tex,csv}, families.{md,csv}, best_rule.{md,tex,csv} (rows with
    a `base`; the rule chosen in `rule_selection`, none picked without it), fpr95_by_method.png, heatmap_{auroc,fpr95}.png.
    With `threshold_transfer`: threshold_transfer.{md}. With `scores`: roc_<set>.png, score_density_<method>.png,
    bootstrap.{md,tex,csv} (`bootstrap` replicates, seeded by `seed`), and, when the scores name their images
    (file_name, manifest): hop_auroc.*, species_field.* (field sets, with the transfer table), id_looking.{md,csv} and
    id_looking_<set>.png (`top_k` images). `methods` restricts the report; `log` receives a line per skipped part.
    """
    out = Out(Path(out_dir), log or (lambda line: None))
    out.folder.mkdir(parents=True, exist_ok=True)
    frame, scale = read_results(results)
    frame = select_methods(frame, methods)
    layout = Layout.of(frame)
    selection = read_rule_selection(rule_selection) if rule_selection is not None else None
    transfer = None
    if threshold_transfer is not None:
        transfer = _restricted(read_table(threshold_transfer, TRANSFER_REQUIRED, "threshold-transfer table"), methods)
    sections = [warnings_section(out, frame), *per_set_sections(out, frame, scale)]
    best = best_rule_section(out, frame, scale, selection)
    sections += [best] if best is not None else []
    sections += [transfer_section(out, transfer)] if transfer is not None else []
    sections.append(figure_section(out, frame))
    if scores is not None:
        found = _restricted(read_scores(scores), layout.methods)
        where = Path(run_dir) if run_dir is not None else _run_dir(scores, results)
        sections += _score_sections(out, found, layout, transfer, bootstrap, seed, top_k, where)
    elif bootstrap:
        out.log("report: --bootstrap needs the scores table (scores.parquet)")
    title = f"OOD detection report: {len(layout.methods)} method(s), {len(layout.sets)} OOD set(s)"
    out.text("index.html", index_html(title, sections))
    return out.written
