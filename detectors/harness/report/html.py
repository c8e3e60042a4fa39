"""`index.html`: one static page with every table and figure of the report, linked relatively (the folder can be moved
or served as it is). It opens on the result: the title, the metric conventions (stated once), one line counting the
warnings per kind (details at the end and in warnings.md), then the paper's first table; the table of contents is one
line that unfolds. Wide tables scroll inside their box and the page fits a 1,400 px screen."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from detectors.harness.report.render import View, to_html

MAIN_TABLE = "main-table"
"""The HTML id of the page's main table (the paper's first table); the Chromium check looks for it."""
WARNINGS_FILE = "warnings.md"

STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1360px; padding: 0.4em 12px; color: #222;
       box-sizing: border-box; }
h1 { font-size: 1.3em; margin: 0.2em 0; }
h2 { font-size: 1.1em; border-bottom: 1px solid #ccc; margin: 1.2em 0 0.4em; }
h3 { font-size: 0.95em; margin: 0.6em 0 0.2em; }
p.lead, p.warn, details.toc { font-size: 0.82em; margin: 0.15em 0; color: #444; }
p.warn { color: #8a4b00; }
details.toc ul { columns: 3; margin: 0.2em 0; }
table { border-collapse: collapse; font-size: 0.74em; margin: 0.3em 0 0.6em; }
th, td { border: 1px solid #ddd; padding: 1px 4px; text-align: center; white-space: nowrap; }
th { background: #f2f2f2; }
th.span { background: #e4e4e4; }
td.key { text-align: left; }
td.merged { vertical-align: middle; }
.scroll { overflow-x: auto; max-width: 100%; }
.flag { color: #c00; font-weight: bold; }
p.note { font-size: 0.78em; color: #555; margin: 0.2em 0; max-width: 110em; }
.figures { display: flex; flex-wrap: wrap; gap: 0.6em; }
figure { margin: 0.3em 0; max-width: 100%; }
figure img { max-width: min(100%, 900px); border: 1px solid #eee; }
figure img.wide { max-width: 100%; }
figcaption { font-size: 0.78em; color: #555; max-width: 900px; }
.files { font-size: 0.78em; color: #666; }
"""


@dataclass
class Section:
    """One part of the page: text, tables (`views`), links to the files that hold them, figures (relative names) with
    their `captions`; a `collapsed` section unfolds on a click (diagnostics)."""

    title: str
    views: list[View] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    captions: dict[str, str] = field(default_factory=dict)
    collapsed: bool = False
    wide: set[str] = field(default_factory=set)
    """Figures shown up to the page's width (thumbnail sheets, many-curve legends); the others at most 900 px."""

    @property
    def anchor(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")


def _section_html(section: Section) -> str:
    esc = html.escape
    out = [f"<p>{esc(t)}</p>" for t in section.text]
    for view in section.views:
        if view.title:
            out.append(f"<h3>{esc(view.title)}</h3>")
        out.append(f'<div class="scroll">{to_html(view)}</div>')
    if section.images:
        figures = []
        for image in section.images:
            name = esc(image)
            caption = esc(section.captions.get(image, ""))
            wide = ' class="wide"' if image in section.wide else ""
            figures.append(f'<figure><a href="{name}"><img{wide} src="{name}" alt="{caption or name}"></a>'
                           f'<figcaption>{caption} <span class="files">({name})</span></figcaption></figure>')
        out.append('<div class="figures">' + "".join(figures) + "</div>")
    if section.files:
        links = ", ".join(f'<a href="{esc(f)}">{esc(f)}</a>' for f in section.files)
        out.append(f'<p class="files">Files: {links}</p>')
    body = "\n".join(out)
    if section.collapsed:
        body = f"<details><summary>show</summary>\n{body}\n</details>"
    return f'<h2 id="{section.anchor}">{esc(section.title)}</h2>\n{body}'


def index_html(title: str, sections: list[Section], conventions: str = "", warnings: list[str] | None = None) -> str:
    """The whole page: title, `conventions` (one line), the `warnings` summary (one line, linking to the Warnings
    section and warnings.md when it exists), the contents (folded), then each section."""
    esc = html.escape
    nav = "".join(f'<li><a href="#{s.anchor}">{esc(s.title)}</a></li>' for s in sections)
    lead = f'<p class="lead">{esc(conventions)}</p>\n' if conventions else ""
    warn = ""
    if warnings:
        link = ' — <a href="#warnings">details</a>' + (f' (<a href="{WARNINGS_FILE}">{WARNINGS_FILE}</a>)')
        warn = f'<p class="warn">Warnings: {esc("; ".join(warnings))}{link}</p>\n'
    toc = f'<details class="toc"><summary>Contents ({len(sections)} sections)</summary><ul>{nav}</ul></details>\n'
    body = "\n".join(_section_html(s) for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{esc(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n<h1>{esc(title)}</h1>\n{lead}{warn}{toc}{body}\n"
            "</body>\n</html>\n")


def referenced_files(page: str) -> list[str]:
    """Every `src` / `href` of the page that is not an in-page anchor or an absolute URL."""
    found = re.findall(r'(?:src|href)="([^"#][^"]*)"', page)
    return [html.unescape(f) for f in dict.fromkeys(found) if not re.match(r"^[a-z]+:", f)]


def missing_files(index: str | Path) -> list[str]:
    """The files `index` references that do not exist beside it."""
    index = Path(index)
    return [f for f in referenced_files(index.read_text(encoding="utf-8")) if not (index.parent / f).is_file()]


__all__ = ["MAIN_TABLE", "WARNINGS_FILE", "Section", "index_html", "referenced_files", "missing_files"]
