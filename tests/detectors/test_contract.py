"""The detector contract, for every registered detector: it builds with its defaults, its declarations hold (search
space within its hyperparameters, defaults valid, runtime settings out of the saved config), it fits on toy inputs
matching what it declares (inputs, fit_inputs, needs), gives finite float64 scores of shape [N], and a save/load
round trip through `detectors.load` gives the same scores.

Fits use a few shortened settings (`FAST`: epochs, crops, steps, a small word list) so that the file runs in well
under a minute on one core; every other value is the default."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers.images import CLASSES, colour_images
from helpers.models import small_conv_classifier, tiny_resnet_classifier
from helpers.toys import toy_features, toy_head

import detectors
from detectors import FeatureSet, ImageSet
from pipelines.data import make_row, write_manifest

FAMILIES = ("posthoc", "clip", "generative", "training")
NAMES = [name for family in FAMILIES for name in detectors.available(family)]
# every detector with its defaults, and the training-time methods also in their fast "heads" mode
CASES = [(name, {}) for name in NAMES] + [
    (name, {"mode": "heads"})
    for name in detectors.available("training") if "heads" in detectors.detector_class(name).modes]
TRAINING_FAST = {"epochs": 1, "batch_size": 8, "warmup_epochs": 0}
FAST: dict[str, dict[str, Any]] = {
    "opengan": {"epochs": 2},
    "locoop": {"epochs": 1, "shots": 2, "train_batch": 2},
    "idlike": {"epochs": 1, "n_crops": 4, "n_select": 2, "n_ood_prompts": 2},
    "lapt": {"epochs": 1, "train_batch": 8, "words": ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat"],
             "adjectives": ["shiny", "wooden"], "n_train_negatives": 4, "n_negatives": 6, "ngroup": 2},
    "clipn": {"epochs": 1, "train_batch": 4},
    "neglabel": {"words": ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar"],
                 "adjectives": ["shiny", "wooden", "tiny", "blue"], "ngroup": 2, "neg_fraction": 0.5},
    "adaneg": {"words": ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar"],
               "adjectives": ["shiny", "wooden", "tiny", "blue"], "n_negatives": 6, "ngroup": 2},
    "oodd": {"words": ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar"],
             "adjectives": ["shiny", "wooden", "tiny", "blue"], "ngroup": 2, "neg_fraction": 0.5},
    "negrefine": {"negative_nouns": ["apple", "boat", "cloud", "dog"], "negative_adjectives": ["wooden object"],
                  "ngroup": 2},
    "csp": {"words": ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar"],
            "adjectives": ["shiny", "wooden", "tiny", "blue"], "ngroup": 2, "neg_fraction": 0.5},
    "diffguard": {"steps": 6, "max_inversion_steps": 4, "n_crops": 2, "early_stop_similarity": None,
                  "early_stop_psnr": 15.0, "distance": "ssim"},
    "udg": {"num_clusters": 4, "pca_dim": 3},
    "cider": {"k": 5},
    "npos": {"k": 5, "sample_number": 3, "sample_from": 10, "start_epoch_knn": 1, "synthesis_k": 2, "select": 3,
             "id_points_num": 4},
    "diffpath": {"steps": 2, "gmm_components": [1, 2], "cv_folds": 2, "n_jobs": 1},
}


def fast(cls: type[detectors.Detector]) -> dict[str, Any]:
    return {**(TRAINING_FAST if cls.family == "training" else {}), **FAST.get(cls.name, {})}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Any]:
    """Everything a detector may need: toy features and head, labelled images (also as a manifest), tiny models."""
    from detectors.clip.backbone import ClipBackbone
    from pipelines.tiny import save_tiny_clip, save_tiny_pixel_unet

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("contract")
    images = colour_images([0], 10, 1) + colour_images([1], 10, 2) + colour_images([2], 10, 3)
    labels = np.repeat(np.arange(3), 10)  # 10 per class: GRAM holds out one per class
    for i, image in enumerate(images):
        image.save(root / f"{i}.png")
    rows = [make_row(f"{i}.png", split="train" if i % 5 else "val", label=int(y)) for i, y in enumerate(labels)]
    for i, image in enumerate(colour_images([0, 1, 2], 6, 4)):  # auxiliary rows of two species (Extended's aux_label)
        image.save(root / f"aux{i}.png")
        rows.append(make_row(f"aux{i}.png", split="train", role="ood", ood_set="auxiliary", aux_label=i % 2))
    manifest = write_manifest(root, rows)
    aux = toy_features(40, seed=5, ood=True)
    test = [toy_features(10, seed=3), toy_features(10, seed=4, ood=True)]
    return {
        "root": root,
        "train": toy_features(90, seed=0), "val": toy_features(30, seed=1),
        "ood_val": toy_features(30, seed=2, ood=True),
        "aux": FeatureSet(aux.features, aux.logits, np.arange(40) % 2),  # auxiliary species 0, 1 (Extended reads them)
        "test": FeatureSet(np.concatenate([t.features for t in test]), np.concatenate([t.logits for t in test])),
        "head": toy_head(),
        "images": ImageSet(images=images, labels=labels),
        "manifest": {"train": ImageSet.from_manifest(manifest, split="train", role="id"),
                     "id_val": ImageSet.from_manifest(manifest, split="val", role="id"),
                     "aux": ImageSet.from_manifest(manifest, role="ood")},
        "test_images": ImageSet(images=colour_images([0], 2, 7) + colour_images([0, 1], 2, 8)),
        "clip": ClipBackbone.load(str(save_tiny_clip(root / "clip")), device="cpu"),
        "resnet": tiny_resnet_classifier(root / "resnet", classes=3),
        "conv": small_conv_classifier(num_classes=3),
        "unet": str(save_tiny_pixel_unet(root / "unet")),
    }


def runtime(cls: type[detectors.Detector], world: dict[str, Any]) -> dict[str, Any]:
    """The runtime objects the class declares in `needs` (and a loaded CLIP for CLIP detectors)."""
    out: dict[str, Any] = {}
    if "classifier" in cls.needs:  # training-time methods fine-tune their own copy (as the runner hands them)
        out["classifier"] = world["conv"] if cls.name == "diffguard" else world["resnet"]
        out["classifier"] = copy.deepcopy(out["classifier"]) if cls.family == "training" else out["classifier"]
    if "class_names" in cls.needs:
        out["class_names"] = list(CLASSES) + ["blue"]
    if "cache_dir" in cls.needs:
        out["cache_dir"] = str(world["root"] / "cache" / cls.name)
    if "device" in cls.needs:
        out["device"] = "cpu"
    if "work_dir" in cls.needs:
        out["work_dir"] = str(world["root"] / "work" / cls.name)
    if cls.family == "clip":
        out["model"] = world["clip"]
    return out


def models(cls: type[detectors.Detector], world: dict[str, Any]) -> dict[str, Any]:
    """Model hyperparameters pointing at the tiny models (saved in config.json, so not passed again on load)."""
    if cls.name == "ensemble":  # two members: the tiny ResNet's folder twice
        return {"members": [str(world["root"] / "resnet")] * 2}
    return {"unet_id": world["unet"]} if cls.name in ("diffguard", "diffpath") else {}


def fit_inputs(det: detectors.Detector, world: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    """(id_train, fit keyword arguments, test batch) matching the instance's `inputs` and its class's `fit_inputs`."""
    cls = type(det)
    if "images" in det.inputs and cls.family == "training":  # full mode: fine-tunes on manifest rows
        data = world["manifest"]
        return data["train"], {k: data[k] for k in ("id_val", "aux") if k in cls.fit_inputs}, data["id_val"]
    if "images" in det.inputs:
        return world["images"], {"id_val": world["images"]} if "id_val" in cls.fit_inputs else {}, world["test_images"]
    available = {"head": world["head"], "id_val": world["val"], "ood_val": world["ood_val"], "aux": world["aux"]}
    return world["train"], {k: v for k, v in available.items() if k in cls.fit_inputs}, world["test"]


@pytest.mark.parametrize("name", NAMES)
def test_builds_with_defaults_and_its_declarations_hold(name):
    cls = detectors.detector_class(name)
    det = cls()
    runtime_keys = cls.Params.runtime()
    assert set(det.params) == set(cls.defaults) and set(det.hyperparameters) == set(cls.defaults) - runtime_keys
    cls.check_params(det.hyperparameters)
    json.dumps(det.hyperparameters)  # what config.json and results rows record
    assert set(cls.search_space) <= set(det.hyperparameters)
    for key, values in cls.search_space.items():
        for value in values:
            cls.check_params({key: value})
    assert cls.fit_inputs <= set(detectors.base.FIT_INPUTS) and cls.needs <= set(detectors.base.RUNTIME_INPUTS)
    assert all(cls.Params.doc(field) for field in cls.defaults), f"{name}: every parameter has a one-line doc"


@pytest.mark.filterwarnings("ignore:neglabel. only")  # FAST's short word list
@pytest.mark.parametrize("name, mode", CASES, ids=[n + ("-" + m["mode"] if m else "") for n, m in CASES])
def test_fits_scores_and_round_trips(name, mode, world, tmp_path):
    cls = detectors.detector_class(name)
    objects = runtime(cls, world)
    det = detectors.build(name, **objects, **models(cls, world), **fast(cls), **mode)
    train, kwargs, test = fit_inputs(det, world)
    det.fit(train, **kwargs)
    scores = det.score(test)
    assert scores.dtype == np.float64 and scores.shape == (len(test),) and np.isfinite(scores).all()
    folder = det.save_pretrained(tmp_path / name)
    saved = json.loads((Path(folder) / "config.json").read_text())["params"]
    assert not set(saved) & cls.Params.runtime() and saved == json.loads(json.dumps(det.hyperparameters))
    loaded = detectors.load(folder, **runtime(cls, world))
    assert type(loaded) is cls and loaded.fitted
    if name == "diffpath":  # load refits its density on the saved features: bitwise on current versions, one float64
        # ulp apart on the floors (scikit-learn 1.4.2, diffusers 0.36)
        np.testing.assert_allclose(loaded.score(test), scores, rtol=1e-14, atol=0)
    else:
        np.testing.assert_array_equal(loaded.score(test), scores)
    effective = json.loads(json.dumps(det.effective_params()))  # what a results row records (tuples become lists)
    assert set(effective) == set(det.hyperparameters) and json.loads(json.dumps(loaded.effective_params())) == effective


def test_effective_params_resolve_what_the_fit_decided(world):
    from detectors.posthoc.vim import principal_dim

    vim = detectors.build("vim").fit(world["train"], head=world["head"])
    unset = {"default_dim": None}  # a protocol's default (detectors.harness.protocols), unset here
    assert (vim.hyperparameters == {"dim": None, **unset} and vim.effective_params() == {"dim": principal_dim(8),
                                                                                         **unset})
    assert (detectors.build("vim", dim=6).fit(world["train"], head=world["head"]).effective_params()
            == {"dim": 6, **unset})
    assert detectors.build("vim", default_dim=5).fit(world["train"], head=world["head"]).effective_params()["dim"] == 5
    assert detectors.build("neco").fit(world["train"]).effective_params()["dim"] == principal_dim(8)
    ts = detectors.build("tempscale").fit(world["train"], id_val=world["val"])
    assert ts.effective_params() == {"temperature": ts.fitted_temperature, "output": "logodds", "fit": "lbfgs"}
    assert detectors.build("locoop", class_names=["a"] * 10).effective_params()["top_k"] == 2  # 20% of 10 classes


@pytest.mark.parametrize("name, params, dims, message", [
    ("knn", {"k": -5}, None, r"knn: k must be >= 1, got -5"),
    ("ash", {"percentile": 100}, None, r"ash: percentile must be >= 0 and < 100, got 100"),
    ("dice", {"percentile": 100}, None, r"dice: percentile must be >= 0 and < 100, got 100"),
    ("vim", {"dim": 100000}, {"features": 2048, "classes": 1000},
     r"vim: dim must be >= 1 and < features, got 100000 \(not < features \(2048\)\)"),
    ("odin", {"temperature": "hot"}, None, r"odin: temperature must be a number, got 'hot'"),
    ("openmax", {"alpha": 11}, {"features": 64, "classes": 10}, r"openmax: alpha must be >= 1 and <= classes"),
    ("locoop", {"top_k": 0}, None, r"locoop: top_k must be >= 1"),
    ("tempscale", {"fit": "adam"}, None, r"tempscale: fit must be one of 'lbfgs', 'exact', got 'adam'"),
    ("mcm", {"embed_batch_size": 0}, None, r"mcm: embed_batch_size must be >= 1"),
    ("oe", {"score_rule": "energy"}, None, r"oe: score_rule must be one of 'msp', got 'energy'"),
    ("msp", {"temperature": 2}, None, r"msp: unknown parameter\(s\) \['temperature'\]"),
])
def test_bad_values_fail_at_plan_time(name, params, dims, message):
    """What the runner checks before any model loads (and again once D and C are known): type, range, name."""
    with pytest.raises(ValueError, match=message):
        detectors.detector_class(name).check_params(params, dims)


def test_dimension_bounds_wait_for_the_dimensions():
    vim = detectors.detector_class("vim")
    vim.check_params({"dim": 100000})  # D unknown at plan time: checked again once the features are known
    vim.check_params({"dim": 2047}, {"features": 2048, "classes": 1000})
    detectors.detector_class("neco").check_params({"dim": 2048}, {"features": 2048})
