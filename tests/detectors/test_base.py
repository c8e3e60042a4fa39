"""detectors.base (containers, score checks, Detector fit/score/save/load) and detectors.registry."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest
import torch
from PIL import Image

from detectors import registry
from detectors.base import Detector, FeatureSet, ImageSet, LinearHead, Params, as_numpy, check_scores, param


class MeanDistance(Detector):
    """Test detector: minus `scale` times the Euclidean distance to the ID training mean."""

    @dataclass(frozen=True)
    class Params(Params):
        scale: float = param(1.0, "multiplier of the distance", gt=0)

    family = "posthoc"
    inputs = frozenset({"features"})
    search_space = {"scale": [0.5, 1.0, 2.0]}

    def _fit(self, id_train, *, id_val=None, ood_val=None):
        id_train.require("features", who=self.name)
        self.mean = id_train.features.astype(np.float64).mean(axis=0)

    def _score(self, batch):
        return -self.scale * np.linalg.norm(batch.features - self.mean, axis=1)

    def state(self):
        return {**super().state(), "mean": self.mean}

    def load_state(self, state):
        super().load_state(state)
        self.mean = state["mean"]


class HeadNeeded(Detector):
    family = "posthoc"
    inputs = frozenset({"features"})
    needs_head = True


@pytest.fixture
def fresh_registry(monkeypatch):
    """An empty registry (the real detector modules are not loaded) holding MeanDistance as 'mean_distance'."""
    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "_LOADED", set(registry.FAMILIES))
    registry.register_detector("mean_distance")(MeanDistance)
    return registry


def features(seed: int, n: int = 20, d: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


# -- containers
# ---------------------------------------------------------------------------------------------------------
def test_as_numpy_upcasts_half_tensors():
    x = torch.tensor([[1.5, -2.25]], dtype=torch.bfloat16)
    out = as_numpy(x)
    assert out.dtype == np.float32 and np.array_equal(out, [[1.5, -2.25]])
    assert as_numpy([1, 2], np.float64).dtype == np.float64
    assert as_numpy(None) is None


def test_featureset_conversion_subset_and_errors():
    fs = FeatureSet(features=np.arange(6).reshape(3, 2), logits=torch.ones(3, 4, dtype=torch.float16), labels=[0, 1, 2])
    assert fs.features.dtype == np.float32 and fs.logits.dtype == np.float32 and len(fs) == 3
    part = fs.subset(np.array([True, False, True]))
    assert np.array_equal(part.features, [[0, 1], [4, 5]]) and np.array_equal(part.labels, [0, 2])
    with pytest.raises(ValueError, match=r"disagree.*'features': 3.*'logits': 2"):
        FeatureSet(features=np.zeros((3, 2)), logits=np.zeros((2, 4)))
    with pytest.raises(ValueError, match="vim needs logits"):
        FeatureSet(features=np.zeros((3, 2))).require("features", "logits", who="vim")
    assert len(FeatureSet()) == 0


def test_linear_head_matches_float64_matmul():
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(4, 5)), rng.normal(size=4)
    x = features(1, n=7)
    out = LinearHead(torch.tensor(weight), bias)(x)
    expected = x.astype(np.float64) @ weight.T + bias
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"weight \[C,D\] and bias \[C\]"):
        LinearHead(weight, np.zeros(3))


def test_check_scores():
    out = check_scores([[1, 2, 3]])
    assert out.dtype == np.float64 and out.shape == (3,)
    with pytest.raises(FloatingPointError, match=r"knn produced 2 non-finite score\(s\) \(first at index 1\)"):
        check_scores(np.array([0.0, np.nan, np.inf]), who="knn")


def test_imageset_from_images():
    images = [Image.new("L", (8, 6), 100), Image.new("RGBA", (5, 5))]
    images_set = ImageSet(images=images, labels=[3, 4])
    assert len(images_set) == 2 and images_set.keys == ["0", "1"] and np.array_equal(images_set.labels, [3, 4])
    batches = list(images_set.batches(1))
    assert [start for start, _ in batches] == [0, 1] and all(b[0].mode == "RGB" for _, b in batches)
    with pytest.raises(ValueError, match="exactly one"):
        ImageSet()


# -- Detector
# -----------------------------------------------------------------------------------------------------------
def test_detector_params_fit_and_score(fresh_registry):
    det = fresh_registry.build("mean_distance", scale=2.0)
    assert det.params == {"scale": 2.0} and det.scale == 2.0 and repr(det) == "MeanDistance(scale=2.0)"
    train, test = features(0), features(1, n=6)
    scores = det.fit(FeatureSet(features=train)).score(FeatureSet(features=test))
    mean = train.astype(np.float64).mean(axis=0)
    expected = [-2.0 * np.sqrt(sum((float(v) - m) ** 2 for v, m in zip(row, mean))) for row in test]
    assert det.fitted and scores.dtype == np.float64
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    with pytest.raises(TypeError, match=r"unknown parameter\(s\) \['k'\]; known: \['scale'\]"):
        MeanDistance(k=3)
    with pytest.raises(FloatingPointError, match="mean_distance produced 1 non-finite"):
        det.score(FeatureSet(features=np.array([[np.nan] * 5], dtype=np.float32)))
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        det.missing  # noqa: B018


def test_detector_head_requirement():
    with pytest.raises(ValueError, match="needs the classifier's linear head"):
        HeadNeeded().fit(FeatureSet(features=features(0)))
    det = HeadNeeded().fit(FeatureSet(features=features(0)), head=(np.eye(5), np.zeros(5)))
    assert isinstance(det.head, LinearHead) and np.array_equal(det.head.weight, np.eye(5))


def test_save_and_load_round_trip(fresh_registry, tmp_path):
    det = MeanDistance(scale=0.5).fit(FeatureSet(features=features(0)),
                                      head=LinearHead(np.ones((2, 5)), np.arange(2.0)))
    det.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config == {"name": "mean_distance", "family": "posthoc", "params": {"scale": 0.5}, "fitted": True}
    loaded = Detector.from_pretrained(tmp_path / "saved")
    test = FeatureSet(features=features(2, n=4))
    assert type(loaded) is MeanDistance and loaded.fitted
    np.testing.assert_array_equal(loaded.score(test), det.score(test))
    np.testing.assert_array_equal(loaded.head.bias, [0.0, 1.0])
    doubled = MeanDistance.from_pretrained(tmp_path / "saved", scale=1.0)
    np.testing.assert_allclose(doubled.score(test), 2 * det.score(test))
    with pytest.raises(FileNotFoundError, match="not a saved detector folder"):
        Detector.from_pretrained(tmp_path / "nothing")


def test_accepts():
    class WithClassifier(MeanDistance):
        needs = frozenset({"classifier"})

        def __init__(self, classifier=None, **params):
            super().__init__(**params)

    assert MeanDistance.accepts("scale") and not MeanDistance.accepts("classifier")
    assert WithClassifier.accepts("classifier")
    assert MeanDistance.defaults == {"scale": 1.0}


class Typed(Detector):
    """Every kind of declared type and bound, and a runtime setting."""

    @dataclass(frozen=True)
    class Params(Params):
        k: int = param(5, "neighbours", ge=1)
        dim: int | None = param(None, "subspace", ge=1, lt="features")
        top: int = param(2, "top classes", le="classes")
        percentile: float = param(90, "percentile", gt=0, lt=100)
        mode: Literal["a", "b"] = param("a", "mode")
        powers: list[int] = param([1, 2], "powers")
        flag: bool = param(True, "flag")
        device: str | None = param(None, "device", runtime=True)

    family = "posthoc"
    needs = frozenset({"device"})


@pytest.mark.parametrize("params, dims, message", [
    ({"k": -5}, None, r"typed: k must be >= 1, got -5"),
    ({"k": 2.5}, None, r"typed: k must be an integer, got 2.5"),
    ({"k": True}, None, r"typed: k must be an integer, got True"),
    ({"percentile": 100}, None, r"typed: percentile must be > 0 and < 100, got 100"),
    ({"percentile": "hot"}, None, r"typed: percentile must be a number, got 'hot'"),
    ({"mode": "c"}, None, r"typed: mode must be one of 'a', 'b', got 'c'"),
    ({"powers": [1, "2"]}, None, r"typed: powers must be a list \(items: an integer\), got \[1, '2'\]"),
    ({"flag": 1}, None, r"typed: flag must be true or false, got 1"),
    ({"dim": 8}, {"features": 8, "classes": 3},
     r"typed: dim must be >= 1 and < features \(8\)|dim must be >= 1 and < features, got 8"),
    ({"top": 4}, {"features": 8, "classes": 3}, r"typed: top must be <= classes, got 4 \(not <= classes \(3\)\)"),
    ({"K": 3}, None, r"typed: unknown parameter\(s\) \['K'\]"),
])
def test_check_params_names_the_parameter_and_what_is_allowed(fresh_registry, params, dims, message):
    fresh_registry.register_detector("typed")(Typed)
    with pytest.raises(ValueError, match=message):
        Typed.check_params(params, dims)


def test_check_params_accepts_good_values_and_dimension_bounds_wait_for_dims(fresh_registry):
    fresh_registry.register_detector("typed")(Typed)
    Typed.check_params({"k": 3, "dim": 100000, "percentile": 99.5, "mode": "b", "powers": [3], "device": "cpu"})
    Typed.check_params({"dim": 7, "top": 3}, {"features": 8, "classes": 3})
    with pytest.raises(ValueError, match="typed: dim"):
        Typed.check_params({"dim": 100000}, {"features": 8})
    with pytest.raises(ValueError, match="typed: k must be >= 1"):
        Typed(k=0)  # construction validates too


def test_runtime_settings_stay_out_of_saved_config_and_hyperparameters(fresh_registry, tmp_path):
    fresh_registry.register_detector("typed")(Typed)
    det = Typed(k=3, device="cpu")
    assert det.params["device"] == "cpu" and det.k == 3 and "device" not in det.hyperparameters
    det.save_pretrained(tmp_path / "t")
    saved = json.loads((tmp_path / "t" / "config.json").read_text())["params"]
    assert "device" not in saved and saved["k"] == 3 and saved["powers"] == [1, 2]
    again = registry.load(tmp_path / "t", device="cuda")
    assert type(again) is Typed and again.params == {**det.params, "device": "cuda"}
    assert Typed().powers is not Typed().powers  # list defaults are copied per instance


def test_registration_checks_declarations(fresh_registry):
    def declare(**attrs):
        return type("Bad", (MeanDistance,), attrs)

    cases = [
        (declare(search_space={"alpha": [1]}), r"search_space key 'alpha' is not a hyperparameter"),
        (declare(search_space={"scale": [0, 1]}), r"search_space\['scale'\]: scale must be > 0, got 0"),
        (declare(search_space={"scale": []}), "non-empty list"),
        (declare(fit_inputs=frozenset({"aux"})), r"fit_inputs declares \['aux'\], which fit\(\) does not accept"),
        (declare(fit_inputs=frozenset({"labels"})), "not among"),
        (declare(needs=frozenset({"classifier"})), r"needs \['classifier'\] but the constructor takes \[\]"),
        (declare(needs_head=True), "needs_head without 'head'"),
        (declare(fit=lambda self, id_train, *, aux=None: self), r"fit\(\) accepts \['aux'\], missing from fit_inputs"),
        (declare(__init__=lambda self, classifier=None, **p: None),
         r"needs \[\] but the constructor takes \['classifier'\]"),
    ]
    for i, (cls, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            fresh_registry.register_detector(f"bad{i}")(cls)


def test_from_pretrained_needs_no_registry_import():
    """base.py imports nothing from the registry (no circle): the registry hands its lookup to Detector."""
    import ast
    import inspect as inspect_

    import detectors.base as base

    tree = ast.parse(inspect_.getsource(base))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "detectors.registry" not in imported and "detectors" not in imported
    assert Detector.class_of("msp") is registry.detector_class("msp")


# -- registry
# -----------------------------------------------------------------------------------------------------------
def test_registry_build_available_and_errors(fresh_registry):
    @fresh_registry.register_detector("mean_distance_clip")
    class ClipMean(MeanDistance):
        family = "clip"

    assert fresh_registry.available() == ["mean_distance", "mean_distance_clip"]
    assert fresh_registry.available(family="clip") == ["mean_distance_clip"]
    assert fresh_registry.available(pattern="*_clip") == ["mean_distance_clip"]
    assert fresh_registry.detector_class("Mean_Distance") is MeanDistance
    assert isinstance(fresh_registry.build("mean_distance_clip"), ClipMean)
    with pytest.raises(KeyError,
                       match=r"unknown detector 'distance'; did you mean mean_distance \(Post-hoc\), "
                             r"mean_distance_clip \(VLM-based\)\?"):
        fresh_registry.detector_class("distance")
    with pytest.raises(KeyError, match=r"unknown detector 'zzz' Available: \['mean_distance', 'mean_distance_clip'\]"):
        fresh_registry.build("zzz")
    with pytest.raises(ValueError, match="lower-case"):
        fresh_registry.register_detector("Mean")
    with pytest.raises(ValueError, match="already registered"):
        fresh_registry.register_detector("mean_distance")(HeadNeeded)

    class NoFamily(Detector):
        pass

    with pytest.raises(ValueError, match="must set `family`"):
        fresh_registry.register_detector("no_family")(NoFamily)


def test_real_registry_is_consistent():
    names = registry.available()
    assert names == sorted(names) and names
    for name in names:
        cls = registry.detector_class(name)
        if not cls.__module__.startswith("detectors."):  # a plugin an earlier test registered
            continue
        assert cls.name == name and cls.family in {"posthoc", "clip", "generative", "training"}
        assert set(cls.search_space) <= set(cls.defaults) - cls.Params.runtime(), name
