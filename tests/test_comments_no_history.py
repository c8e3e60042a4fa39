"""Comments and docstrings say what the code does and why, never its history (the git log keeps that): every .py file
of the tree is read with `tokenize` (comments) and `ast` (docstrings and other statement-level strings), and a line
holding one of the unambiguous history markers in `MARKERS` fails here, named as file:line. Code strings (messages,
test data) are not read."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("benchmarks", "detectors", "gen", "oodforge", "pipelines", "scripts", "tests")
MARKERS = re.compile(r"\bformerly\b|\bpreviously\b|\bno longer\b|\bused to be\b|\bissue #|\bissue \d+|\bstop \d+",
                     re.IGNORECASE)


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every comment and of every line of a statement-level string (docstrings included)."""
    found = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        for statement in body if isinstance(body, list) else []:  # a lambda's body is an expression
            if (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)):
                found += [(statement.lineno + i, line) for i, line in enumerate(statement.value.value.splitlines())]
    return found


def history_lines(text: str) -> list[tuple[int, str]]:
    return sorted((line, prose.strip()) for line, prose in prose_lines(text) if MARKERS.search(prose))


def test_the_scanner_reads_comments_and_docstrings_only():
    source = '''"""A module.

Issue 12 made this."""
X = "formerly a code string, not prose"


def f():
    """The image was resized: not history."""
    return X  # formerly Y


class C:
    # a comment
    attribute = 1
    """previously 2"""
'''
    assert history_lines(source) == [(3, "Issue 12 made this."), (9, "# formerly Y"), (15, "previously 2")]


def test_no_comment_or_docstring_carries_history():
    faults = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name, text = path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")
            faults += [f"{name}:{line}: {prose[:100]}" for line, prose in history_lines(text)]
    assert not faults, ("comments and docstrings say what and why; the history is in the git log:\n"
                        + "\n".join(faults))
