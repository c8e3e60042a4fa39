"""pipelines.class_names: the one class_names.json schema; names from rows (class_name, else species, else the label
number), a label with two names refused, a model folder's id2label."""
from __future__ import annotations

import json

import pytest

from pipelines.class_names import ClassNames, model_class_names, names_from_rows, read_class_names, write_class_names
from pipelines.data import make_row
from pipelines.errors import UserInputError


def test_round_trip_and_malformed_files(tmp_path):
    names = ClassNames(["Actias luna", "Zale lunata"], "species", ["genus"])
    write_class_names(tmp_path, names)
    assert read_class_names(tmp_path) == names
    assert json.loads((tmp_path / "class_names.json").read_text()) == {"names": ["Actias luna", "Zale lunata"],
                                                                      "label_field": "species", "levels": ["genus"]}
    assert read_class_names(tmp_path / "none") is None
    for text, message in (("{", "not readable JSON"), ('{"names": [1, 2]}', "expected"),
                          ('{"names": ["a", "a"]}', "given twice")):
        (tmp_path / "class_names.json").write_text(text)
        with pytest.raises(UserInputError, match=message):
            read_class_names(tmp_path)


def test_names_from_rows_prefer_class_name_then_species_then_the_label():
    rows = [make_row("a.png", label=1, species="Zale lunata"), make_row("b.png", label=0, species="Actias luna"),
            make_row("c.png", role="ood", ood_set="aux", species="Other")]
    assert names_from_rows(rows) == ClassNames(["Actias luna", "Zale lunata"], "species")
    rows[0]["class_name"], rows[1]["class_name"] = "zale", "actias"
    assert names_from_rows(rows).names == ["actias", "zale"] and names_from_rows(rows).label_field == "class_name"
    plain = [make_row("a.png", label=2), make_row("b.png", label=0)]
    assert names_from_rows(plain) == ClassNames(["0", "1", "2"], None)
    assert names_from_rows([]) == ClassNames([])
    clash = [make_row("a.png", label=0, species="A"), make_row("b.png", label=0, species="B")]
    with pytest.raises(UserInputError, match="label 0 has two species: 'A' and 'B' \\(b.png\\)"):
        names_from_rows(clash)


def test_model_folder_names_from_class_names_json_or_id2label(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {"1": "bee", "0": "ant", "10": "wasp", "2": "cat",
                                                                   **{str(i): f"x{i}" for i in range(3, 10)}}}))
    assert (model_class_names(tmp_path).names[:3] == ["ant", "bee", "cat"]
            and model_class_names(tmp_path).names[10] == "wasp")
    write_class_names(tmp_path, ClassNames(["a", "b"]))
    assert model_class_names(tmp_path).names == ["a", "b"]
    assert model_class_names(tmp_path / "empty") is None
