"""The default hub ids are declared once (pipelines/hub_ids.py): no other module of the packages or scripts spells one
as a string value (docstrings and comments may name them), and every id has its real configs shipped."""
import ast
from pathlib import Path

import pytest

from pipelines import hub, hub_ids

ROOT = Path(__file__).resolve().parents[2]
IDS = {value for name, value in vars(hub_ids).items() if name.endswith("_ID")}


def string_values(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


@pytest.mark.slow
def test_default_hub_ids_are_declared_only_in_hub_ids():
    files = [p for top in ("pipelines", "gen", "detectors", "oodforge", "scripts") for p in (ROOT / top).rglob("*.py")
             if p.name != "hub_ids.py"]
    found = [f"{p.relative_to(ROOT)}:{line}: {value}" for p in files for line,
             value in string_values(p) if value in IDS]
    assert found == []


def test_every_default_id_has_its_real_configs():
    assert len(IDS) == 9
    assert all(hub.model_dir(model_id).is_dir() for model_id in IDS)
