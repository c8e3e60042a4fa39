"""Every protocol's effective training hyperparameters, pinned here as numbers: the training-time detectors under each
evaluation protocol (what their fine-tunes and head trainings are handed), and each classifier recipe under each
training protocol (what `train_classifier` hands `finetune`)."""
from __future__ import annotations

import inspect
import typing
from pathlib import Path

import numpy as np
import pytest

import detectors
from detectors.base import FeatureSet, LinearHead
from detectors.harness.protocols import PROTOCOLS, protocol_params
from pipelines.data import Manifest, make_row
from pipelines.training import LoopSettings, TrainSettings
from pipelines.training.recipes import RECIPES, TrainConfig

HYPER = ("epochs", "lr", "batch_size", "weight_decay", "warmup_epochs", "seed", "precision", "schedule", "drop_last")
"""The training hyperparameters (`TrainSettings`' fields)."""


class _Handed(Exception):
    """Raised by a stand-in trainer once it has recorded what it was handed."""


def _effective(fn, args: tuple, kwargs: dict) -> dict:
    """The hyperparameters a call of `fn` (finetune / train_heads) trains with: its `settings` (None: the defaults)
    with its keyword overrides, as the loop reads them (`LoopSettings.of`)."""
    bound = inspect.signature(inspect.unwrap(fn)).bind(*args, **kwargs)
    settings = LoopSettings.of(bound.arguments.get("settings"), **bound.arguments.get("options", {}))
    return {**{k: getattr(settings, k) for k in HYPER}, "weights": settings.weights}


def _handed(monkeypatch, name: str) -> dict:
    """Replace `detectors.training.common.<name>` by a recorder of what it is handed; returns the record."""
    import detectors.training.common as common
    import pipelines.training as training

    real, seen = getattr(training, name), {}

    def record(*args, **kwargs):
        seen.update(_effective(real, args, kwargs))
        raise _Handed

    monkeypatch.setattr(common, name, record)
    return seen


def _features(rng, n: int = 12, d: int = 4) -> FeatureSet:
    return FeatureSet(rng.normal(size=(n, d)), rng.normal(size=(n, 3)), np.arange(n) % 3)


def _rows(root: Path, n: int = 6) -> Manifest:
    return Manifest(root, [make_row(f"{i}.png", split="train", label=i % 3) for i in range(n)])


def detector_settings(monkeypatch, protocol: str, name: str, classifier=None, root: Path | None = None) -> dict:
    """What a fit of detector `name` under `protocol` hands its trainer: train_heads on features (heads mode), or
    finetune on manifest rows with `classifier` (full mode)."""
    rng = np.random.default_rng(0)
    full = classifier is not None
    seen = _handed(monkeypatch, "finetune" if full else "train_heads")
    given = protocol_params(protocol, name)
    detector = detectors.build(name, classifier=classifier, **(given if full else {**given, "mode": "heads"}))
    with pytest.raises(_Handed):
        if full:
            detector.fit(_rows(root), id_val=_rows(root), aux=_rows(root))
        else:
            detector.fit(_features(rng), head=LinearHead(rng.normal(size=(3, 4)), np.zeros(3)), id_val=_features(rng),
                         aux=_features(rng))
    return {**seen, "checkpoint": detector.params["checkpoint"], "augment": detector.params["augment"]}


def recipe_settings(tmp_path: Path, recipe: str, protocol: str | None) -> dict:
    raw = {"id": str(tmp_path), "out": str(tmp_path / "out"), "recipe": recipe, "protocol": protocol}
    if recipe == "multi-granularity":
        raw["levels"] = ["genus"]
    config = TrainConfig.from_dict(raw)
    return {k: getattr(config, k) for k in (*HYPER, "augment", "image_size", "pre_size", "pretrained", "protocol")}


FINETUNE = {"epochs": 30, "lr": 0.001, "batch_size": 512, "weight_decay": 1e-05, "warmup_epochs": 2, "seed": 0,
            "augment": "region"}
"""Every training-time method's fine-tune under every protocol: Open-Insects' 30 epochs, AdamW lr 1e-3, batch 512."""
LOOP = {
    "exact": {"schedule": "clean", "drop_last": True, "precision": "auto", "checkpoint": "last", "weights": "last"},
    "openood_v1.5": {"schedule": "clean", "drop_last": True, "precision": "auto", "checkpoint": "best",
                     "weights": "best"},
    "open-insects": {"schedule": "reference", "drop_last": False, "precision": "fp32", "checkpoint": "best",
                     "weights": "best"},
}
METHOD = ({("rotpred", p): {"batch_size": 256} for p in LOOP} | {("mixoe", "open-insects"): {"drop_last": True}}
          | {(name, p): {"checkpoint": "last", "weights": "last"} for p in LOOP
             for name in ("cider", "npos", "palm", "reweightood")})
"""RotPred's published batch (all protocols); MixOE's trainer drops its last batch (Open-Insect); CIDER, NPOS, PALM and
ReweightOOD have no ID-val accuracy to choose an epoch by (their recorder keeps the lowest training loss): the last
epoch."""

RECIPE = {
    "open-insects-scratch": {"epochs": 120, "batch_size": 512, "lr": 0.01, "weight_decay": 1e-05, "warmup_epochs": 6,
                             "pretrained": False, "protocol": "open-insects"},
    "open-insects-imagenet": {"epochs": 120, "batch_size": 512, "lr": 0.01, "weight_decay": 1e-05, "warmup_epochs": 6,
                              "pretrained": True, "protocol": "open-insects"},
    "multi-granularity": {"epochs": 30, "batch_size": 64, "lr": 0.001, "weight_decay": 1e-05, "warmup_epochs": 2,
                          "pretrained": True, "protocol": "exact"},
}
TRAINING = {
    "open-insects": {"schedule": "reference", "drop_last": False, "precision": "fp32", "augment": "ami",
                     "image_size": 126, "pre_size": 128, "seed": 0},
    "exact": {"schedule": "clean", "drop_last": True, "precision": "auto", "augment": "imagenet", "image_size": None,
              "pre_size": None, "seed": 0},
}


def _expected(protocol: str, name: str) -> dict:
    return {**FINETUNE, **LOOP[protocol], **METHOD.get((name, protocol), {})}


def test_every_protocol_is_pinned():
    assert set(LOOP) == set(PROTOCOLS) and set(RECIPE) == set(RECIPES) and set(HYPER) == set(TrainSettings.fields())


def test_the_defaults_are_the_open_insects_fine_tune_under_exact():
    """`finetune` / `train_heads` without settings train as a training-time
    method's fine-tune does under `exact`."""
    assert TrainSettings().as_dict() == {k: v for k, v in {**FINETUNE, **LOOP["exact"]}.items() if k in HYPER}


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_training_methods_heads_mode(monkeypatch, protocol):
    for name in detectors.available("training"):
        if "heads" in typing.get_args(detectors.detector_class(name).Params.hints()["mode"]):
            assert detector_settings(monkeypatch, protocol, name) == _expected(protocol, name), name


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    from helpers.models import tiny_resnet_classifier

    return tiny_resnet_classifier(tmp_path_factory.mktemp("clf"))


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_training_methods_full_mode(monkeypatch, tmp_path, classifier, protocol):
    for name in detectors.available("training"):
        assert detector_settings(monkeypatch, protocol, name, classifier, tmp_path) == _expected(protocol, name), name


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("protocol", [None, "open-insects", "exact"])
def test_classifier_recipes(tmp_path, recipe, protocol):
    values = RECIPE[recipe]
    expected = {**values, **TRAINING[protocol or values["protocol"]], "protocol": protocol or values["protocol"]}
    assert recipe_settings(tmp_path, recipe, protocol) == expected


@pytest.mark.parametrize("protocol", ["open-insects", "exact"])
def test_train_classifier_hands_finetune_its_config(tmp_path, monkeypatch, protocol):
    """`train_classifier` trains with the resolved config's values (here the default recipe's)."""
    from helpers.models import tiny_resnet_classifier

    import pipelines.training.classify as classify
    from pipelines.importers import import_classes
    from tests.pipelines.own_data_helpers import class_tree

    tiny_resnet_classifier(tmp_path / "model")
    import_classes(class_tree(tmp_path / "photos", {"train": 2, "val": 1, "test": 1}), tmp_path / "id")
    config = TrainConfig.from_dict({"id": str(tmp_path / "id"), "out": str(tmp_path / "out"), "protocol": protocol,
                                    "model": str(tmp_path / "model"), "num_workers": 0, "image_size": 16,
                                    "pre_size": 16})
    real, seen = classify.finetune, {}

    def record(*args, **kwargs):
        seen.update(_effective(real, args, kwargs))
        raise _Handed

    monkeypatch.setattr(classify, "finetune", record)
    with pytest.raises(_Handed):
        classify.train_classifier(config)
    values = RECIPE["open-insects-imagenet"]
    assert seen == {**{k: values[k] for k in HYPER if k in values}, **{k: TRAINING[protocol][k] for k in HYPER
                                                                        if k in TRAINING[protocol]}, "weights": "last"}
