"""Every fact about a detector lives on its class (label, reference, grids and defaults per protocol); the report's
names, the protocol tables and the docs' method tables are read from, or checked against, the classes."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import detectors
from detectors.base import Detector
from detectors.harness import protocols
from detectors.harness.report.names import METHOD_LABELS
from detectors.registry import detector_class, register_detector
from pipelines.params import Params, param

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_class_carries_its_own_label_and_the_report_reads_it():
    for name in detectors.available():
        cls = detector_class(name)
        if not cls.__module__.startswith("detectors."):
            continue  # a test's own plugin, registered after the report's names were read
        assert cls.__dict__.get("label"), name  # its own, not a parent's (RP-ODIN is no ODIN)
        assert METHOD_LABELS[name] == cls.label
    assert METHOD_LABELS["rp_odin"] == "RP-ODIN" and METHOD_LABELS["odin"] == "ODIN"


def test_a_class_without_its_own_label_shows_its_name_never_its_parents_label():
    class Child(detector_class("odin")):
        pass

    try:
        register_detector("child_test_only")(Child)
        assert Child.label == "child_test_only"
    finally:
        detectors.registry._REGISTRY.pop("child_test_only", None)


def test_a_grid_is_checked_like_the_search_space():
    class BadGrid(Detector):
        family = "posthoc"
        label = "Bad"
        grids = {"open-insects": {"nope": [1]}}

    with pytest.raises(ValueError, match=r"grids\['open-insects'\] key 'nope' is not a hyperparameter"):
        register_detector("bad_grid_test_only")(BadGrid)


def test_a_parameter_named_like_a_class_fact_is_refused():
    class Shadowed(Detector):
        family = "posthoc"
        label = "Shadowed"

        @dataclass(frozen=True)
        class Params(Params):
            reference_code: str = param("x", "a parameter a class attribute would shadow")

    with pytest.raises(ValueError, match=r"parameter\(s\) \['reference_code'\] would be shadowed"):
        register_detector("shadowed_test_only")(Shadowed)
    assert detector_class("diffguard")(classifier=None).params["reference"] == "auto"  # a parameter, not a fact


def test_protocol_tables_are_the_classes_facts():
    """The tables are read from the classes: one home per grid (ash, fdbd, knn, nci, react: `search_space`)."""
    for name in ("ash", "fdbd", "knn", "nci", "react", "gen", "odin"):
        cls = detector_class(name)
        assert protocols.SWEEPS["openood_v1.5"][name] == cls.search_space
        assert protocols.SWEEPS["exact"][name] == cls.search_space
    assert protocols.SWEEPS["open-insects"]["react"] == detector_class("react").grids["open-insects"]
    assert protocols.SWEEPS["open-insects"]["rp_odin"] == detector_class("odin").search_space  # inherited
    assert protocols.protocol_params("open-insects", "vim") == detector_class("vim").protocol_defaults["openood_v1.5"]
    assert "neco" in protocols.DEFAULTS_ONLY["exact"] and "neco" in protocols.SWEEPS["open-insects"]


def test_an_unknown_protocol_on_a_class_is_refused(monkeypatch):
    cls = detector_class("knn")
    monkeypatch.setattr(cls, "grids", {"openood_v15": {}})
    with pytest.raises(ValueError, match=r"unknown protocol\(s\) \['openood_v15'\]"):
        protocols._classes()


def test_every_posthoc_and_clip_reference_is_the_docs_row():
    """docs/references.md names each post-hoc and CLIP method's reference file, as its class does (the CLIP methods
    of clip.md's table, MCM to CLIPN, are found there)."""
    text = (DOCS / "references.md").read_text() + "\n" + (DOCS / "clip.md").read_text()
    for name in detectors.available("posthoc") + detectors.available("clip"):
        cls = detector_class(name)
        assert cls.reference_code, name
        rows = [line for line in text.splitlines() if line.startswith("|") and f"`{name}`" in line.split("|")[1]]
        assert rows, f"docs/references.md has no row for {name}"
        path = re.search(r"[\w./-]+\.py", cls.reference_code)
        needle = path.group(0) if path else cls.reference_code
        assert any(needle in row.replace("`", "") for row in rows), (name, needle)


def test_docs_method_tables_agree_with_the_classes():
    """A row `| `name` | family | ...` in the post-hoc docs pages names a registered method of that family."""
    seen = set()
    for page in sorted(DOCS.glob("detectors_posthoc_*.md")):
        for line in page.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and re.fullmatch(r"`[a-z_0-9]+`", cells[0]) and cells[1] in detectors.registry.FAMILIES:
                name = cells[0].strip("`")
                assert detector_class(name).family == cells[1], (page.name, name)
                seen.add(name)
    assert len(seen) >= 10  # the tables were read
