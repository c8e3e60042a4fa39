"""Each fact is defined once (issue 23): the source tree is scanned with `ast`, and a second definition of the detector
families, the OOD groups, the metric names, softmax / logsumexp, the file-name sanitiser or the `class_names.json`
schema fails here, naming the file and line."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from detectors.registry import FAMILIES
from detectors.tables import METRICS
from pipelines.class_names import CLASS_NAMES as CLASS_NAMES_FILE
from pipelines.schema import GROUPS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "detectors", "gen", "scripts")
SANITISER_KNOWN = {
    # a second sanitiser the lead should fold into pipelines.io.safe_name at merge (owner's file, not touched here)
    "gen/pairing.py": "genconfig's file: a pair's file-name stem",
    # not a file name: an HTML anchor id (lower case, hyphens), which safe_name's characters would not give
    "detectors/report/html.py": "an HTML anchor slug",
}


def _sources() -> list[tuple[str, ast.Module]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found.append((path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))))
    return found


SOURCES = _sources()


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function) or bare string statements."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)}


def _string_collections(tree: ast.Module):
    """(line, set of strings) of every tuple / list / set literal of string constants, and of every dict's keys."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        strings = {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if strings:
            yield node.lineno, strings


def _where(fact: set[str], exact: bool = False) -> list[str]:
    return [f"{name}:{line}" for name, tree in SOURCES for line, strings in _string_collections(tree)
            if (strings == fact if exact else fact <= strings)]


@pytest.mark.parametrize("fact, home, exact", [
    (set(FAMILIES), "detectors/registry.py", True),
    (set(GROUPS), "pipelines/schema.py", False),
    (set(METRICS), "detectors/tables.py", False),
], ids=["families", "groups", "metrics"])
def test_one_literal_list(fact, home, exact):
    found = [f for f in _where(fact, exact) if not f.startswith(COMPUTED.get(tuple(sorted(fact)), "-"))]
    assert found and all(f.startswith(home + ":") for f in found), found


COMPUTED = {tuple(sorted(METRICS)): "detectors/metrics.py:"}
"""Where a fact's values are computed rather than listed: `detectors.metrics.evaluate` returns each metric by name."""


def test_the_computed_metrics_are_the_listed_ones():
    from detectors.metrics import evaluate

    assert tuple(evaluate([0.0, 1.0, 2.0], [0.5, -1.0])) == METRICS


def test_softmax_and_logsumexp_once():
    pattern = re.compile(r"^_?(log_?)?(softmax|logsumexp)\d*$")
    defined = [f"{name}:{node.lineno} {node.name}" for name, tree in SOURCES for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and pattern.match(node.name)]
    assert sorted(d.split(" ")[1] for d in defined) == ["log_softmax", "logsumexp", "softmax"], defined
    assert all(d.startswith("detectors/posthoc/common.py:") for d in defined), defined


def _sanitisers(tree: ast.Module) -> list[int]:
    """Lines of a character-by-character name cleaner (`c if c.isalnum() else ...`) or a negated character-class
    substitution (`re.sub(r"[^a-z0-9]+", ...)`)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp) and any(isinstance(n, ast.Attribute) and n.attr == "isalnum"
                                               for n in ast.walk(node.test)):
            lines.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sub"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and re.search(r"\[\^[^\]]*(a-z|A-Z|0-9|\\w)", node.args[0].value)):
            lines.append(node.lineno)
    return lines


def test_one_file_name_sanitiser():
    found = {name: _sanitisers(tree) for name, tree in SOURCES}
    found = {name: lines for name, lines in found.items() if lines}
    assert set(found) - set(SANITISER_KNOWN) == {"pipelines/io.py"} and len(found["pipelines/io.py"]) == 1, found


def test_class_names_json_schema_once():
    """The file name appears as a value in one module (docstrings aside), and only class_names.py spells its keys."""
    named = [f"{name}:{node.lineno}" for name, tree in SOURCES for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value == CLASS_NAMES_FILE and id(node) not in _docstrings(tree)]
    assert [n.split(":")[0] for n in named] == ["pipelines/class_names.py"], named
    schema = _where({"names", "label_field", "levels"})
    assert all(s.startswith("pipelines/class_names.py:") for s in schema) and schema, schema


def test_a_second_definition_is_found(tmp_path):
    """The scan finds what it looks for: a planted second softmax, family list and sanitiser are each seen."""
    planted = ast.parse('FAMILIES = ("posthoc", "clip", "generative", "training")\n'
                        "def softmax(x):\n    return x\n"
                        "slug = ''.join(c if c.isalnum() else '-' for c in name)\n")
    assert [line for line, s in _string_collections(planted) if s == set(FAMILIES)] == [1]
    assert [n.name for n in ast.walk(planted) if isinstance(n, ast.FunctionDef)] == ["softmax"]
    assert _sanitisers(planted) == [4]
