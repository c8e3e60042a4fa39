"""One table value (`View`) and its three renderers: markdown, LaTeX (booktabs) and HTML.

Every table of the report is first built as a `View` (cells already formatted, with best / second-best marks and the
low-AUROC flag as data), then rendered by `to_markdown`, `to_latex` or `to_html`. Marks: 1 bold, 2 underlined, 3 both
(markdown **bold** / _italics_ for underline, which it lacks; LaTeX \\textbf / \\underline; HTML <b> / <u>); a flagged
value carries a dagger.
"""
from __future__ import annotations

import html
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from detectors.harness.report.tables import (
    ALL,
    CELL_METRICS,
    LOW_AUROC,
    Layout,
    low_auroc,
    method_info,
    method_summary,
    rank_marks,
    read_results,
    select_methods,
)
from detectors.harness.results import COLUMN_LABELS, LOWER_IS_BETTER

MISSING = "–"
DAGGER = "†"
FLAG_NOTE = f"{DAGGER} AUROC below {LOW_AUROC:.0f}: the detector scores this OOD set as more in-distribution than ID."
CONVENTIONS = ("Metrics in percent. AUROC: higher is better. FPR@95 (lower is better) is OpenOOD v1.5's "
               "(detectors/metrics.py): OOD is the positive class, and FPR@95 is the share of ID test images rejected "
               "at the threshold where 95% of the OOD images are detected. Scores: higher = more in-distribution; an "
               "image is flagged OOD iff its score is below the threshold.")
"""The metric conventions, stated once at the top of the page."""


@dataclass(frozen=True)
class Part:
    """A formatted value: `mark` 1 bold (best), 2 underlined (second best, or best overall), 3 both, 0 none; `flag` a
    low AUROC."""

    text: str
    mark: int = 0
    flag: bool = False


Cell = tuple[Part, ...]
"""One table cell: its parts are shown joined by ' / ' (e.g. FPR@95 / AUROC)."""


@dataclass(frozen=True)
class View:
    """A rendered table's content: `index` headers and `columns` headers, then rows of (index values, cells).

    `spans` (label, width) group the data columns in LaTeX and HTML, which then show `short` headers under them;
    `merge_first` blanks a repeated first index value (and LaTeX draws a rule where it changes); `merged` maps a data
    column to (first row, rows) ranges shown as one cell (one value the rows share: HTML `rowspan`, LaTeX `\\multirow`,
    markdown the value in the first row and the others blank); `html_id` names the HTML table."""

    note: str
    index: list[str]
    columns: list[str]
    rows: list[tuple[tuple[str, ...], list[Cell]]]
    spans: list[tuple[str, int]] | None = None
    short: list[str] | None = None
    merge_first: bool = False
    title: str = ""
    extra_notes: list[str] = field(default_factory=list)
    merged: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    html_id: str = ""

    def covered(self) -> dict[tuple[int, int], int]:
        """(row, data column) -> 0 for a cell inside a merged range below its first row, n for the first row of an
        n-row range."""
        out = {}
        for column, ranges in self.merged.items():
            for first, n in ranges:
                out[(first, column)] = n
                out.update({(r, column): 0 for r in range(first + 1, first + n)})
        return out


def number(value: Any, spec: str = ".2f") -> str:
    """A number as rendered; NaN, None and missing values as '–'."""
    if value is None or value is pd.NA:
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return MISSING if not math.isfinite(value) else format(value, spec)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return str(value)


def scale_note(scale: str) -> str:
    return ("Input metrics were fractions, converted to percent." if scale == "fraction"
            else "Input metrics were in percent.")


# -- renderers --------------------------------------------------------------------------------------------------------
def _notes(view: View) -> list[str]:
    return [n for n in [view.note, *view.extra_notes] if n]


def _md_part(part: Part) -> str:
    text = {1: "**{}**", 2: "_{}_", 3: "**_{}_**"}.get(part.mark, "{}").format(part.text)
    return text + DAGGER if part.flag else text


def _first_keys(view: View) -> list[tuple[str, ...]]:
    """Index values with a repeated first value blanked (when `merge_first`)."""
    out, previous = [], None
    for keys, _ in view.rows:
        shown = keys if not view.merge_first or keys[0] != previous else ("", *keys[1:])
        out.append(shown)
        previous = keys[0] if keys else None
    return out


def to_markdown(view: View) -> str:
    """The view as a markdown table, its notes first."""
    lines = [" ".join(_notes(view)), ""] if _notes(view) else []
    lines += ["| " + " | ".join([*view.index, *view.columns]) + " |",
              "|" + "|".join([":--"] * len(view.index) + [":-:"] * len(view.columns)) + "|"]
    covered = view.covered()
    for i, (keys, (_, cells)) in enumerate(zip(_first_keys(view), view.rows)):
        shown = ["" if covered.get((i, j)) == 0 else " / ".join(_md_part(p) for p in c) for j, c in enumerate(cells)]
        lines.append("| " + " | ".join([*keys, *shown]) + " |")
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
                  "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", DAGGER: r"\textsuperscript{\dag}",
                  "–": "--"}


def latex_escape(text: str) -> str:
    """`text` with LaTeX's special characters escaped."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def _tex_part(part: Part) -> str:
    text = {1: r"\textbf{{{}}}", 2: r"\underline{{{}}}", 3: r"\textbf{{\underline{{{}}}}}"}.get(part.mark, "{}")
    text = text.format(latex_escape(part.text))
    return text + r"\textsuperscript{\dag}" if part.flag else text


def _tex_header(view: View) -> list[str]:
    n_index = len(view.index)
    if not view.spans:
        return [" & ".join(latex_escape(h) for h in [*view.index, *view.columns]) + " \\\\"]
    spans = " & ".join(f"\\multicolumn{{{n}}}{{c}}{{{latex_escape(g)}}}" for g, n in view.spans)
    start, rules = n_index + 1, []
    for label, n in view.spans:
        if label:
            rules.append(f"\\cmidrule(lr){{{start}-{start + n - 1}}}")
        start += n
    short = view.short or view.columns
    return [" & " * n_index + spans + " \\\\", " ".join(rules),
            " & ".join(latex_escape(h) for h in [*view.index, *short]) + " \\\\"]


def _tex_cell(cell: Cell, rows: int | None) -> str:
    text = " / ".join(_tex_part(p) for p in cell)
    return "" if rows == 0 else (f"\\multirow{{{rows}}}{{*}}{{{text}}}" if rows and rows > 1 else text)


def to_latex(view: View) -> str:
    """The view as a booktabs `tabular`, its notes as comment lines."""
    packages = "booktabs, multirow" if view.merged else "booktabs"
    lines = [f"% {n}" for n in _notes(view)] + [f"% Needs \\usepackage{{{packages}}}.",
                                                 "\\begin{tabular}{" + "l" * len(view.index) + "c" * len(view.columns)
                                                 + "}", "\\toprule", *_tex_header(view)]
    lines.append("\\midrule")
    previous, covered = None, view.covered()
    for i, (keys, (full, cells)) in enumerate(zip(_first_keys(view), view.rows)):
        if view.merge_first and i and full[0] != previous:
            lines.append("\\midrule")
        previous = full[0] if full else None
        shown = [_tex_cell(c, covered.get((i, j))) for j, c in enumerate(cells)]
        lines.append(" & ".join([*map(latex_escape, keys), *shown]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def _html_part(part: Part) -> str:
    text = html.escape(part.text)
    text = {1: "<b>{}</b>", 2: "<u>{}</u>", 3: "<b><u>{}</u></b>"}.get(part.mark, "{}").format(text)
    return f'{text}<span class="flag" title="{html.escape(FLAG_NOTE)}">{DAGGER}</span>' if part.flag else text


def to_html(view: View) -> str:
    """The view as an HTML table (column groups as a header row), its notes as paragraphs under it."""
    esc = html.escape
    head = []
    if view.spans:
        head.append("<tr>" + "<th></th>" * len(view.index) +
                    "".join(f'<th colspan="{n}" class="span">{esc(g)}</th>' for g, n in view.spans) + "</tr>")
    headers = [*view.index, *(view.short if view.spans and view.short else view.columns)]
    head.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>")
    body, covered = [], view.covered()
    for i, (keys, (_, cells)) in enumerate(zip(_first_keys(view), view.rows)):
        shown = []
        for j, c in enumerate(cells):
            rows = covered.get((i, j))
            if rows != 0:
                span = f' rowspan="{rows}" class="merged"' if rows and rows > 1 else ""
                shown.append(f"<td{span}>" + " / ".join(_html_part(p) for p in c) + "</td>")
        body.append("<tr>" + "".join(f'<td class="key">{esc(k)}</td>' for k in keys) + "".join(shown) + "</tr>")
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in _notes(view))
    table_id = f' id="{esc(view.html_id)}"' if view.html_id else ""
    return (f'<table{table_id}>\n<thead>{"".join(head)}</thead>\n<tbody>\n' + "\n".join(body) +
            f"\n</tbody></table>\n{notes}")


# -- views of the report's tables -------------------------------------------------------------------------------------
def grid_cells(table: pd.DataFrame, metrics: Sequence[str] = CELL_METRICS, flag: bool = True,
               flag_columns: Collection[str] | None = None) -> pd.DataFrame:
    """'FPR@95 / AUROC' cells (tuples of `Part`) with best / second-best marks per column and metric, and (with `flag`)
    the low-AUROC flag on a set's AUROC below `LOW_AUROC`: on `flag_columns` (the OOD sets), by default every column
    but the averages (`... avg`)."""
    columns = list(dict.fromkeys(table.columns.get_level_values("column")))
    out = pd.DataFrame(index=table.index, columns=columns, dtype=object)
    for column in columns:
        parts = []
        for metric in metrics:
            values = table[(column, metric)]
            marks = rank_marks(values, LOWER_IS_BETTER[metric])
            is_set = column in flag_columns if flag_columns is not None else not str(column).endswith(" avg")
            low = flag and metric == "auroc" and is_set
            parts.append([Part(number(v), int(k), bool(low and v < LOW_AUROC)) for v, k in zip(values, marks)])
        out[column] = list(zip(*parts))
    return out


def _method_label(method: str, info: pd.DataFrame | None) -> str:
    if info is not None and method in info.index and info.loc[method, "mode"] == "heads":
        return f"{method} (heads)"
    return method


def per_set_view(table: pd.DataFrame, layout: Layout, scale: str, info: pd.DataFrame | None = None) -> View:
    """The per-set table (`per_set_table`): families x methods, sets grouped by group, then the averages; an `ID acc.`
    column first when `info` (`method_info`) has any ID accuracy; heads-only training rows are labelled."""
    cells = grid_cells(table)
    averages = [c for c in layout.average_columns if c in cells.columns]
    acc = info is not None and info["id_acc"].notna().any()
    columns = [*([COLUMN_LABELS["id_acc"]] if acc else []),
               *[f"{c} ({layout.group_of(c)})" if c in layout.sets else c for c in cells.columns]]
    spans = ([("", 1)] if acc else []) + [(g, len(s)) for g, s in layout.groups.items()]
    spans += [("Average", len(averages))] if averages else []
    short = [*(["ID acc."] if acc else []), *layout.sets, *[c.removesuffix(" avg") for c in averages]]
    rows = []
    for (family, method), row in cells.iterrows():
        first = [(Part(number(info.loc[method, "id_acc"])),)] if acc else []
        rows.append(((family, _method_label(method, info)), [*first, *row]))
    note = (f"Cells: FPR@95 (lower is better) / AUROC (higher is better), in percent. {scale_note(scale)} "
            "Best per column and metric in bold, second best underlined (markdown: italics).")
    merged = {}
    if acc:
        note += " ID acc.: top-1 ID test accuracy, shown once for a family whose methods share one classifier."
        merged = {0: _shared_runs([k[0] for k, _ in rows], [c[0][0].text for _, c in rows])}
    flagged = any(p.flag for _, cs in rows for c in cs for p in c)
    return View(note, ["Family", "Method"], columns, rows, spans, short, merge_first=True,
                extra_notes=[FLAG_NOTE] if flagged else [], merged=merged)


def _shared_runs(groups: Sequence[str], shown: Sequence[str]) -> list[tuple[int, int]]:
    """(first row, rows) of each run of >= 2 consecutive rows of one group that show one value (not missing)."""
    runs, start = [], 0
    for i in range(1, len(groups) + 1):
        if i == len(groups) or groups[i] != groups[start] or shown[i] != shown[start]:
            if i - start > 1 and shown[start] != MISSING:
                runs.append((start, i - start))
            start = i
    return runs


def grid_view(table: pd.DataFrame, labels: Sequence[str], note: str, flag: bool = True) -> View:
    """A (column, metric) table with 'FPR@95 / AUROC' cells; `labels` name the index levels; `flag`: its columns are
    OOD sets, whose AUROC below 50 is flagged."""
    cells = grid_cells(table, flag=flag)
    rows = [(tuple(map(str, key if isinstance(key, tuple) else (key,))), list(row)) for key, row in cells.iterrows()]
    flagged = any(p.flag for _, cs in rows for c in cs for p in c)
    return View(note, list(labels), [str(c) for c in cells.columns], rows, extra_notes=[FLAG_NOTE] if flagged else [])


def frame_view(frame: pd.DataFrame, note: str = "", formats: dict[str, str] | None = None,
               labels: dict[str, str] | None = None) -> View:
    """A plain frame: one column per frame column (headers from `labels`), numbers with `formats[column]` (default
    two decimals), NaN as '–'."""
    formats, labels = formats or {}, labels or {}
    rows = [((), [(Part(number(v, formats.get(c, ".2f"))),) for c, v in zip(frame.columns, row)])
            for row in frame.itertuples(index=False)]
    return View(note, [], [labels.get(c, str(c)) for c in frame.columns], rows)


def markdown_table(frame: pd.DataFrame, formats: dict[str, str] | None = None) -> str:
    """A plain markdown table of `frame` (numbers with `formats[column]`, default two decimals; NaN as '–')."""
    return to_markdown(frame_view(frame, formats=formats))


def summary_view(results: pd.DataFrame, scale: str) -> View:
    """Per method: mean 'FPR@95 / AUROC' over all sets and per group (percent)."""
    layout = Layout.of(results)
    summary = method_summary(results)
    columns = [f"{ALL} avg", *[f"{g} avg" for g in layout.groups]]
    info = method_info(results)
    rows = [((_method_label(method, info), family),
             [(Part(number(row[(c, "fpr95")])), Part(number(row[(c, "auroc")]))) for c in columns])
            for (family, method), row in summary.iterrows()]
    note = f"Mean FPR@95 / AUROC in percent over {len(layout.sets)} OOD set(s). {scale_note(scale)}"
    return View(note, ["Method", "Family"], [c.removesuffix(" avg") for c in columns], rows)


def flag_lines(results: pd.DataFrame) -> list[str]:
    """One console line per (method, set) whose AUROC is below `LOW_AUROC`."""
    return [f"warning: {r.method} on {r.ood_set} ({r.group}): AUROC {r.auroc:.2f} < {LOW_AUROC:.0f} - it scores this "
            "set "
            "as more in-distribution than ID" for r in low_auroc(results).itertuples()]


def render_summary(results: pd.DataFrame | Any, methods: Sequence[str] | None = None) -> str:
    """Compact markdown: per method, mean 'FPR@95 / AUROC' over all sets and per group (percent, two decimals), then a
    warning line for each set whose AUROC is below 50. `results` is the table as the runner wrote it, a frame or a
    file."""
    results, scale = read_results(results)
    results = select_methods(results, methods)
    text = to_markdown(summary_view(results, scale))
    flags = flag_lines(results)
    return text + ("\n" + "\n".join(flags) + "\n" if flags else "")


__all__ = ["MISSING", "DAGGER", "FLAG_NOTE", "CONVENTIONS", "Part", "Cell", "View", "number", "scale_note",
           "to_markdown", "to_latex",
           "to_html", "latex_escape", "grid_cells", "per_set_view", "grid_view", "frame_view", "markdown_table",
           "summary_view", "flag_lines", "render_summary"]
