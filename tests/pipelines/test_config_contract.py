"""Every typed config class, as the contract test does for every detector: each field documented, the defaults (plus
the required keys) build, and a round trip through YAML gives an equal value."""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest
import yaml

from pipelines.configfile import parse_yaml
from pipelines.params import Config


def _import_all() -> None:
    for name in ("pipelines", "gen", "detectors", "oodforge"):
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if "hub_configs" not in info.name:
                importlib.import_module(info.name)


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


_import_all()
CONFIGS = sorted({c for c in _subclasses(Config) if c.__module__.split(".")[0] in ("pipelines", "gen", "detectors")},
                 key=lambda c: f"{c.__module__}.{c.__name__}")
"""The project's configs only: a test module's own Config subclasses (test_params.py's) are not under contract."""


def _required(tmp) -> dict[str, dict]:
    """The required keys of each config class with values that pass its checks (folders made under `tmp`)."""
    folder = tmp / "folder"
    folder.mkdir(exist_ok=True)
    table = tmp / "table.csv"
    table.write_text("species,url\nA b,http://127.0.0.1/a.jpg\n")
    return {
        "DetectorSpec": {"name": "knn"}, "RuleSpec": {"name": "msp"},
        "Box": {"lat_min": 7, "lat_max": 10, "lon_min": -83, "lon_max": -77},
        "EvalConfig": {"id": str(folder), "ood": [str(folder)], "out": str(tmp / "run")},
        "Head": {"levels": str(folder), "level": "coarse"},
        "Transfer": {"source": "local", "targets": ["field"]},
        "GenerationConfig": {"task": "transferred_container", "targets": str(folder), "materials": str(folder),
                             "out": str(tmp / "gen")},
        "MakeSplitsConfig": {"out": str(tmp / "splits"), "synthetic": 4},
        "ContainerCuration": {"imagenet21k": str(folder)},
        "FetchConfig": {"occurrences": str(table), "out": str(tmp / "images")},
        "Source": {"manifest": str(folder)},
        "TrainConfig": {"id": str(folder), "out": str(tmp / "clf")},
        "OpenInsectImport": {"source": str(folder), "out": str(tmp / "open_insect"), "region": "c-america"},
        "ReportConfig": {"results": [str(table)], "out": str(tmp / "report")},
        "FeatureMapConfig": {"id": str(folder), "out": str(tmp / "fmap")},
        "MakeTinyConfig": {"kind": "clip", "out": str(tmp / "tiny")},
        "ConvertClipnConfig": {"checkpoint": str(table), "out": str(tmp / "clipn")},
        "ImportFolderConfig": {"root": str(folder), "out": str(tmp / "own")},
        "ImportOpenOODConfig": {"out": str(tmp / "easy")},
        "TrainPromptsConfig": {"manifest": str(folder), "out_dir": str(tmp / "prompts")},
    }


def test_every_config_class_is_found():
    names = {c.__name__ for c in CONFIGS}
    assert {"EvalConfig", "GenerationConfig", "ZeSTConfig", "ZeSTCall", "TrainConfig", "SplitConfig",
            "MakeSplitsConfig", "Source"} <= names, names


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_fields_documented_defaults_build_and_yaml_round_trips(cls, tmp_path):
    for f in dataclasses.fields(cls):
        assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no one-line doc"
        assert "\n" not in f.metadata["doc"]
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    given = _required(tmp_path).get(cls.__name__, {})
    assert set(required) <= set(given), f"add {cls.__name__}'s required keys {required} to _required()"
    made = cls.from_dict(given, cls.__name__)
    assert cls.from_dict(made.to_dict(), cls.__name__) == made
    assert cls.from_dict(parse_yaml(yaml.safe_dump(made.to_dict())), cls.__name__) == made
