"""Names people use: pytorch-ood's detector classes and OpenOOD's postprocessor / trainer config names resolve to the
registered method in any case, with a one-time note; an unknown name suggests post-hoc methods first."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import registry
from detectors.base import Detector
from detectors.harness.runconfig import DetectorSpec
from detectors.registry import detector_class, register_detector, suggestions

# pytorch-ood 0.4.0 `pytorch_ood/detector/__init__.py` class names and OpenOOD's `postprocessors` / trainer keys
# (openood/postprocessors/utils.py; temperature_scaling in v1.0, temp_scaling in v1.5) -> ours. Names equal to ours
# in some case (ASH, KNN, ViM, ODIN, ...) resolve as names; pytorch-ood's MCD is Monte-Carlo dropout, not our `mcd`.
PYTORCH_OOD = {"EnergyBased": "ebo", "Mahalanobis": "mds", "MaxSoftmax": "msp", "MaxLogit": "mls",
               "KLMatching": "klm", "TemperatureScaling": "tempscale", "RMD": "rmds"}
OPENOOD = {"mds_ensemble": "mdsens", "temperature_scaling": "tempscale", "temp_scaling": "tempscale",
           "conf_branch": "confbranch"}
SAME_NAME = {"ASH": "ash", "DICE": "dice", "fDBD": "fdbd", "GEN": "gen", "GradNorm": "gradnorm", "Gram": "gram",
             "KNN": "knn", "MCM": "mcm", "NCI": "nci", "ODIN": "odin", "OpenMax": "openmax", "RankFeat": "rankfeat",
             "ReAct": "react", "SHE": "she", "ViM": "vim"}


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch):
    monkeypatch.setattr(registry, "_NOTED", set())


@pytest.mark.parametrize("alias, name", sorted({**PYTORCH_OOD, **OPENOOD, **SAME_NAME, "energy": "ebo"}.items()))
def test_the_names_people_use_resolve_in_any_case(alias, name):
    for spelling in (alias, alias.lower(), alias.upper()):
        assert detector_class(spelling).name == name
    assert detectors.build(alias).name == name


def test_pytorch_oods_names_are_its_class_names():
    init = Path(pytorch_ood_detector().__file__)  # pytorch_ood/detector/__init__.py (skips without pytorch-ood)
    exported = set(re.findall(r"^from \.\w+ import (.+)$", init.read_text(), re.M))
    classes = {c.strip() for line in exported for c in line.split(",")}
    assert set(PYTORCH_OOD) | set(SAME_NAME) <= classes


def test_the_note_is_shown_once_and_names_whose_name_it_is(caplog):
    with caplog.at_level(logging.INFO, logger="detectors.registry"):
        detectors.build("energy")
        detectors.build("Energy")
        detectors.build("EnergyBased")
        detectors.build("ebo")  # the registered name: no note
    notes = [r.getMessage() for r in caplog.records if r.name == "detectors.registry"]
    assert notes == ["note: energy is the paper's name for ebo (EBO)",
                     "note: EnergyBased is pytorch-ood's name for ebo (EBO)"]


def test_every_alias_is_listed_with_its_source():
    table = registry.aliases()
    assert table["mds_ensemble"] == ("mdsens", "OpenOOD's") and table["Mahalanobis"] == ("mds", "pytorch-ood's")
    assert not set(a.lower() for a in table) & set(detectors.available())


def test_did_you_mean_prefers_post_hoc_then_the_named_family():
    with pytest.raises(KeyError, match=r"did you mean ebo \(Post-hoc\), energy_oe \(Training-time\)\?"):
        detector_class("energ")
    assert suggestions("maha") == ["mmahalanobis (Post-hoc)", "mds (Post-hoc)"]  # aliases MultiMahalanobis, Mahalanobis
    assert suggestions("energ", family="training")[0] == "energy_oe (Training-time)"
    assert suggestions("zzzz") == []
    with pytest.raises(KeyError, match=r"unknown detector 'zzzz' Available"):
        detector_class("zzzz")


def test_a_config_names_a_method_by_its_alias_and_the_rows_keep_ours():
    assert DetectorSpec.from_dict({"name": "EnergyBased", "params": {"temperature": 2}}).name == "ebo"
    assert DetectorSpec.from_dict({"name": "mahalanobis"}).method == "mds"


def test_an_alias_taken_by_another_method_is_refused():
    class Clash(Detector):
        family = "posthoc"
        label = "Clash"
        aliases = {"MaxLogit": "nobody's"}

    with pytest.raises(ValueError, match=r"alias 'MaxLogit' is already the name or an alias of 'mls'"):
        register_detector("clash_test_only")(Clash)

    class Named(Detector):
        family = "posthoc"
        label = "Named"
        aliases = {"KNN": "nobody's"}

    with pytest.raises(ValueError, match=r"alias 'KNN' is already the name or an alias of 'knn'"):
        register_detector("named_test_only")(Named)
    assert "clash_test_only" not in detectors.available() and "named_test_only" not in detectors.available()
