"""Names agree (docs/architecture.md, "Names"): a detector family's key is its package's name (and its tests'
folder), its display name comes from the one table `FAMILY_LABELS`; each detector module is named after the name it
registers, or, for a module registering several variants of one method, after one of them or after the prefix they
share before an underscore. The registry's view (class -> module) is checked against a scan of the sources'
decorators."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import detectors
from detectors.harness.report.names import family_label
from detectors.registry import FAMILIES, FAMILY_LABELS, FAMILY_PACKAGES, detector_class

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipelines", "detectors", "gen", "oodforge", "scripts", "benchmarks")


def naming_fault(stem: str, names: list[str]) -> str | None:
    """Why a module `stem` should not register `names`, or None when it follows the rule."""
    if stem in names or (len(names) > 1 and all(n.startswith(stem + "_") for n in names)):
        return None
    return f"{stem}.py registers {sorted(names)}: name it after one of them (or their shared prefix)"


def _registered_by_module() -> dict[str, list[str]]:
    """Module path (`detectors/posthoc/ebo.py`) -> the names the registry holds for its classes."""
    found = defaultdict(list)
    for name in detectors.available():
        module = detector_class(name).__module__
        if module.startswith("detectors."):  # a test's own plugin registers from the tests
            found[module.replace(".", "/") + ".py"].append(name)
    return dict(found)


def _decorated_by_module() -> dict[str, list[str]]:
    """The same read from the sources: every `@register_detector("<name>")` in the family packages."""
    found = defaultdict(list)
    for package in FAMILY_PACKAGES.values():
        for path in sorted((ROOT / package.replace(".", "/")).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_detector"
                        and node.args and isinstance(node.args[0], ast.Constant)):
                    found[path.relative_to(ROOT).as_posix()].append(node.args[0].value)
    return dict(found)


def test_the_registry_and_the_sources_agree_on_each_modules_names():
    registered, decorated = _registered_by_module(), _decorated_by_module()
    assert {m: sorted(n) for m, n in registered.items()} == {m: sorted(n) for m, n in decorated.items()}
    assert len(registered) >= 80  # every family's modules were found


def test_every_detector_module_is_named_after_what_it_registers():
    faults = [f"{module}: {fault}" for module, names in _registered_by_module().items()
              if (fault := naming_fault(Path(module).stem, names))]
    assert not faults, faults


@pytest.mark.parametrize("stem, names, ok", [
    ("ebo", ["ebo"], True),
    ("energy", ["ebo"], False),  # the file named after the method's long name, not its registered name
    ("mcm", ["mcm", "glmcm"], True),  # one of its names
    ("rp", ["rp_msp", "rp_ebo"], True),  # the shared prefix
    ("rp", ["rp"], True),
    ("rp", ["rp_msp"], False),  # a single name is the file's name
    ("ada", ["adascale_a", "adascale_l"], False),  # a prefix ends at an underscore
])
def test_the_rule_refuses_a_mismatch(stem, names, ok):
    assert (naming_fault(stem, names) is None) == ok


def test_each_family_is_its_package_and_its_tests_folder():
    assert FAMILY_PACKAGES == {f: f"detectors.{f}" for f in FAMILIES}
    for name in detectors.available():
        cls = detector_class(name)
        if cls.__module__.startswith("detectors."):
            assert cls.__module__.split(".")[1] == cls.family, (name, cls.__module__)
    for family in FAMILIES:
        assert (ROOT / "detectors" / family / "__init__.py").is_file(), family
        assert (ROOT / "tests" / "detectors" / family).is_dir(), family
    assert sorted(p.name for p in (ROOT / "detectors").iterdir() if p.is_dir() and (p / "__init__.py").is_file()
                  and p.name != "harness") == sorted(FAMILIES)


def _label_sites(tree: ast.Module, labels: set[str]) -> list[int]:
    """Lines of string constants (docstrings aside) equal to a family label."""
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in labels
            and id(n) not in docs]


def test_family_labels_are_spelled_in_one_table():
    """Every family has a label; the reports read it (`family_label`); no other module spells one out."""
    assert set(FAMILY_LABELS) == set(FAMILIES) and all(FAMILY_LABELS.values())
    assert {f: family_label(f) for f in FAMILIES} == FAMILY_LABELS
    labels = set(FAMILY_LABELS.values())
    found = [f"{path.relative_to(ROOT).as_posix()}:{line}" for package in PACKAGES
             for path in sorted((ROOT / package).rglob("*.py"))
             for line in _label_sites(ast.parse(path.read_text(encoding="utf-8")), labels)]
    assert found and all(f.startswith("detectors/registry.py:") for f in found), found
    planted = ast.parse('"""VLM-based, in a docstring."""\nLABEL = "VLM-based"\n')
    assert _label_sites(planted, labels) == [2]
