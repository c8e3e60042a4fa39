"""Results table (and per-sample scores) -> benchmark report: tables in markdown, LaTeX and CSV, figures, index.html.

- `tables`: read the results table; layout; per-set (Table 3), family (Table 4) and best-rule tables.
- `scores`: tables from scores.parquet: bootstrap intervals, AUROC per hop, field report per species, ID-looking images.
- `render`: one table value (`View`) and its markdown, LaTeX and HTML renderers.
- `plots`: heatmaps, ROC curves, score densities, FPR@95 by family, the papers' figures, thumbnail sheets;
  `figures`: styles, one-draw saving, rendering in worker processes, tick-overlap checks.
- `names`: the one table of display names (families, methods, sets, regions), each paper's spellings and method order,
  Open-Insects' categories.
- `papers` (a run folder's tables), `open_insects` and `shiftedbronzes`: the two papers' layouts; `aux_study`: the
  subsamples and Figure 4 of the auxiliary-diversity study.
- `html`: index.html; `sections` / `write`: the whole report (`write_report`, `write_open_insects`).

Formats are `detectors.harness.results`'. Everything rendered is in percent.
"""
from __future__ import annotations

from detectors.harness.report.figures import DPI, Job, new_figure, overlapping_ticks, render, save_figure, styles
from detectors.harness.report.html import MAIN_TABLE, Section, index_html, missing_files, referenced_files
from detectors.harness.report.names import (
                                            FAMILY_LABELS,
                                            METHOD_LABELS,
                                            OPEN_INSECTS,
                                            SET_NAMES,
                                            SHIFTED_BRONZES,
                                            Paper,
                                            category,
                                            family_label,
                                            method_label,
                                            set_label,
                                            set_short,
)
from detectors.harness.report.plots import ScoreAxis, kde, robust_limits, roc_points
from detectors.harness.report.render import (
                                            CONVENTIONS,
                                            DAGGER,
                                            FLAG_NOTE,
                                            MISSING,
                                            Part,
                                            View,
                                            flag_lines,
                                            frame_view,
                                            grid_view,
                                            latex_escape,
                                            markdown_table,
                                            per_set_view,
                                            render_summary,
                                            summary_view,
                                            to_html,
                                            to_latex,
                                            to_markdown,
)
from detectors.harness.report.scores import (
                                            HOP_LABELS,
                                            attach_metadata,
                                            bootstrap_interval,
                                            bootstrap_table,
                                            has_sources,
                                            hop_table,
                                            id_looking_table,
                                            per_set_auroc,
                                            read_scores,
                                            resampled_metrics,
                                            species_field_table,
                                            species_summary,
)
from detectors.harness.report.sections import grid_csv, render_threshold_transfer, transfer_view
from detectors.harness.report.tables import (
                                            ALL,
                                            AVERAGE,
                                            CELL_METRICS,
                                            FAMILY_ORDER,
                                            GROUP_MISSING,
                                            GROUP_ORDER,
                                            LOW_AUROC,
                                            NOT_SELECTED,
                                            Layout,
                                            best_rule_table,
                                            companion_files,
                                            family_group_table,
                                            family_table,
                                            low_auroc,
                                            method_info,
                                            method_summary,
                                            per_set_table,
                                            rank_marks,
                                            read_results,
                                            read_rule_selection,
                                            read_table,
                                            select_methods,
                                            to_percent,
)
from detectors.harness.report.write import LAYOUTS, write_open_insects, write_report

__all__ = [
    "MAIN_TABLE", "Section", "index_html", "missing_files", "referenced_files",
    "DPI", "Job", "new_figure", "overlapping_ticks", "render", "save_figure", "styles",
    "FAMILY_LABELS", "METHOD_LABELS", "OPEN_INSECTS", "SET_NAMES", "SHIFTED_BRONZES", "Paper", "category",
    "family_label", "method_label", "set_label", "set_short",
    "ScoreAxis", "kde", "robust_limits", "roc_points",
    "CONVENTIONS", "DAGGER", "FLAG_NOTE", "MISSING", "Part", "View", "flag_lines", "frame_view", "grid_view",
    "latex_escape",
    "markdown_table", "per_set_view", "render_summary", "summary_view", "to_html", "to_latex", "to_markdown",
    "HOP_LABELS", "attach_metadata", "bootstrap_interval", "bootstrap_table", "has_sources", "hop_table",
    "id_looking_table", "per_set_auroc", "read_scores", "resampled_metrics", "species_field_table", "species_summary",
    "grid_csv", "render_threshold_transfer", "transfer_view",
    "ALL", "AVERAGE", "CELL_METRICS", "FAMILY_ORDER", "GROUP_MISSING", "GROUP_ORDER", "LOW_AUROC", "NOT_SELECTED",
    "Layout", "best_rule_table", "family_group_table", "family_table", "low_auroc", "method_info", "method_summary",
    "per_set_table", "rank_marks", "read_results", "read_rule_selection", "read_table", "select_methods", "to_percent",
    "LAYOUTS", "companion_files", "write_open_insects", "write_report",
]
