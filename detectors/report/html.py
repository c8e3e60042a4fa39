"""`index.html`: one static page with every table and figure of the report, linked relatively (the folder can be moved
or served as it is)."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from detectors.report.render import View, to_html

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1500px; padding: 0 1em; color: #222; }
nav { columns: 3; font-size: 0.9em; }
h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: center; white-space: nowrap; }
th { background: #f2f2f2; }
th.span { background: #e4e4e4; }
td.key { text-align: left; }
.scroll { overflow-x: auto; max-width: 100%; }
.flag { color: #c00; font-weight: bold; }
p.note { font-size: 0.85em; color: #555; margin: 0.3em 0; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figure img { max-width: min(100%, 760px); border: 1px solid #eee; }
figcaption { font-size: 0.8em; color: #555; }
.files { font-size: 0.85em; }
"""


@dataclass
class Section:
    """One part of the page: text, tables (`views`), links to the files that hold them, figures (relative names)."""

    title: str
    views: list[View] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")


def _section_html(section: Section) -> str:
    esc = html.escape
    out = [f'<h2 id="{section.anchor}">{esc(section.title)}</h2>']
    out += [f"<p>{esc(t)}</p>" for t in section.text]
    if section.files:
        links = ", ".join(f'<a href="{esc(f)}">{esc(f)}</a>' for f in section.files)
        out.append(f'<p class="files">Files: {links}</p>')
    for view in section.views:
        if view.title:
            out.append(f"<h3>{esc(view.title)}</h3>")
        out.append(f'<div class="scroll">{to_html(view)}</div>')
    for image in section.images:
        name = esc(image)
        out.append(f'<figure><a href="{name}"><img src="{name}" alt="{name}"></a>'
                   f"<figcaption>{name}</figcaption></figure>")
    return "\n".join(out)


def index_html(title: str, sections: list[Section]) -> str:
    """The whole page: a table of contents, then each section."""
    esc = html.escape
    nav = "".join(f'<li><a href="#{s.anchor}">{esc(s.title)}</a></li>' for s in sections)
    body = "\n".join(_section_html(s) for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{esc(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n<h1>{esc(title)}</h1>\n<nav><ul>{nav}</ul></nav>\n{body}\n"
            "</body>\n</html>\n")


def referenced_files(page: str) -> list[str]:
    """Every `src` / `href` of the page that is not an in-page anchor or an absolute URL."""
    found = re.findall(r'(?:src|href)="([^"#][^"]*)"', page)
    return [html.unescape(f) for f in dict.fromkeys(found) if not re.match(r"^[a-z]+:", f)]


def missing_files(index: str | Path) -> list[str]:
    """The files `index` references that do not exist beside it."""
    index = Path(index)
    return [f for f in referenced_files(index.read_text(encoding="utf-8")) if not (index.parent / f).is_file()]


__all__ = ["Section", "index_html", "referenced_files", "missing_files"]
