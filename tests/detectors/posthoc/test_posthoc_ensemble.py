"""Deep Ensemble against OpenOOD's own postprocessor (golden scores made by golden/make_ensemble.py at the commit
golden/ensemble.json names: five tiny conv networks saved as best.ckpt, loaded by its `setup`, scored with 5, 3 and 1
of them), a float64 hand computation (members' logits from their weights, the mean, the softmax), OpenOOD `.ckpt`
members loaded by path against the plain-torch ResNet18_32x32 forward, and the edges (one member, one class, no row,
no member, a member reading other pixels)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from detectors import ImageSet, build
from detectors.posthoc.ensemble import Ensemble
from pipelines.classifier import ImageClassifier

GOLDEN = json.loads((Path(__file__).parent / "golden" / "ensemble.json").read_text())
C_IN, WIDTH, CLASSES = 3, 4, 3


class TinyConv(nn.Module):
    """The golden script's network, forward -> (logits, features) as an ImageClassifier wraps it."""

    def __init__(self, state: dict):
        super().__init__()
        self.conv = nn.Conv2d(C_IN, WIDTH, 3, padding=1)
        self.bn = nn.BatchNorm2d(WIDTH)
        self.fc = nn.Linear(WIDTH, CLASSES)
        own = self.state_dict()
        self.load_state_dict({k: torch.tensor(state[k], dtype=v.dtype) if k in state else v for k, v in own.items()})

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.fc(h), h


def _golden_members() -> list[ImageClassifier]:
    size = len(GOLDEN["inputs"]["test"][0][0])
    return [ImageClassifier.from_module(TinyConv(s), image_size=size, mean=(0.0,) * 3, std=(1.0,) * 3).eval()
            for s in GOLDEN["inputs"]["members"]]


class FlatLinear(nn.Module):
    def __init__(self, size: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(3 * size * size, classes)

    def forward(self, x):
        return self.fc(x.flatten(1)), x.flatten(1)


def _linear_members(k: int, classes: int = 4, size: int = 5) -> list[ImageClassifier]:
    made = []
    for seed in range(k):
        torch.manual_seed(seed)
        made.append(ImageClassifier.from_module(FlatLinear(size, classes), image_size=size, mean=(0.5, 0.4, 0.3),
                                                std=(0.2, 0.3, 0.4)))
    return made


def _by_hand(members: list[ImageClassifier], x: torch.Tensor) -> np.ndarray:
    """float64: each member's W vec(x) + b on the normalised pixels x, their mean, max softmax."""
    flat = x.double().numpy().reshape(len(x), -1)
    logits = np.mean([flat @ m.head.weight.detach().double().numpy().T + m.head.bias.detach().double().numpy()
                      for m in members], axis=0)
    p = np.exp(logits - logits.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)).max(1)


def test_golden_is_openood_at_the_recorded_commit():
    assert GOLDEN["openood_commit"].startswith("3c35632") and GOLDEN["made_by"].endswith("make_ensemble.py")
    assert GOLDEN["defaults"]["num_networks"] == len(GOLDEN["defaults"]["checkpoints"]) == 5
    assert build("ensemble").params == {"members": []} and Ensemble.search_space == {}


@pytest.mark.parametrize("index", range(len(GOLDEN["cases"])))
def test_scores_equal_openood_ensemble_postprocessor(index):
    case = GOLDEN["cases"][index]
    members = _golden_members()[:case["num_networks"]]
    x = torch.tensor(GOLDEN["inputs"]["test"], dtype=torch.float32)
    det = build("ensemble", models=members)
    np.testing.assert_allclose(det.score(x), case["scores"], rtol=1e-6)
    # the run's classifier gives the pixels only: another network with the same inputs changes nothing
    other = ImageClassifier.from_module(TinyConv(GOLDEN["inputs"]["members"][4]), image_size=x.shape[-1],
                                        mean=(0.0,) * 3, std=(1.0,) * 3)
    np.testing.assert_allclose(build("ensemble", classifier=other, models=members).score(x), case["scores"], rtol=1e-6)


def test_mean_of_logits_by_hand_in_float64():
    members = _linear_members(3)
    x = torch.randn(7, 3, 5, 5, generator=torch.Generator().manual_seed(0))  # normalised pixels
    np.testing.assert_allclose(build("ensemble", models=members, batch_size=3).score(x), _by_hand(members, x),
                               rtol=1e-5)


def test_openood_checkpoints_by_path(tmp_path):
    """OpenOOD's own case: best.ckpt files of one ResNet18_32x32 recipe, named as `members`."""
    from pipelines.openood_checkpoints import load_openood_classifier
    from tests.helpers.openood_release import forward_32x32, resnet18_32x32_state

    states, paths = [], []
    for i in range(3):
        states.append(resnet18_32x32_state(num_classes=10, width=4, seed=i))
        paths.append(tmp_path / f"net{i + 1}" / "best.ckpt")
        paths[-1].parent.mkdir()
        torch.save(states[-1], paths[-1])
    run = load_openood_classifier(paths[0])
    Ensemble.check_files({"members": [str(p) for p in paths]})
    det = build("ensemble", classifier=run, members=[str(p) for p in paths])
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(4)]
    got = det.score(ImageSet(images=images))
    x = torch.stack([run.preprocess([im])[0] for im in images])  # normalised with CIFAR-10's mean / std
    logits = np.mean([forward_32x32(s, x).double().numpy() for s in states], axis=0)
    p = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(got, (p / p.sum(1, keepdims=True)).max(1), rtol=1e-5)
    assert det.batch_identity()["members"] != build("ensemble", classifier=run,
                                                    members=[str(p) for p in paths[:2]]).batch_identity()["members"]


@pytest.mark.slow
def test_model_folders_by_path(tmp_path):
    from tests.helpers.models import tiny_resnet_classifier

    loaded = [tiny_resnet_classifier(tmp_path / f"m{i}", classes=3, seed=i, size=16) for i in range(2)]
    det = build("ensemble", classifier=loaded[0], members=[str(tmp_path / "m0"), str(tmp_path / "m1")])
    rng = np.random.default_rng(1)
    images = ImageSet(images=[Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)) for _ in range(3)])
    got = det.score(images)
    x = torch.stack([loaded[0].preprocess([im])[0] for im in images.images])
    with torch.no_grad():
        logits = np.mean([m.eval()(x)[0].double().numpy() for m in loaded], axis=0)
    p = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(got, (p / p.sum(1, keepdims=True)).max(1), rtol=1e-5)


def test_edges_one_member_one_class_no_row_no_member_other_pixels(tmp_path):
    members = _linear_members(2)
    x = torch.randn(5, 3, 5, 5, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = members[0](x)[0].double().numpy()
    np.testing.assert_allclose(build("ensemble", models=members[:1]).score(x), build("msp").score(logits), rtol=1e-6)
    np.testing.assert_allclose(build("ensemble", models=_linear_members(3, classes=1)).score(x), 1.0)
    assert build("ensemble", models=members).score(torch.zeros(0, 3, 5, 5)).shape == (0,)
    assert build("ensemble", models=members).score(ImageSet(images=[])).shape == (0,)

    with pytest.raises(ValueError, match="members: none given"):
        Ensemble.check_files({"members": []})
    with pytest.raises(ValueError, match="does not exist"):
        Ensemble.check_files({"members": [str(tmp_path / "net1" / "best.ckpt")]})
    with pytest.raises(ValueError, match="no members"):
        build("ensemble", classifier=members[0]).score(x)
    with pytest.raises(ValueError, match="not both"):
        build("ensemble", models=members, members=["a"])
    other = ImageClassifier.from_module(FlatLinear(5, 4), image_size=5, mean=(0.5, 0.5, 0.5), std=(0.2, 0.3, 0.4))
    with pytest.raises(ValueError, match="member 1"):
        build("ensemble", models=[members[0], other]).score(x)


def test_path_lists_are_in_the_unit_key(tmp_path):
    """A member's content is part of the unit's key: new weights under the same path run the unit again."""
    from detectors.harness.plan import _path_params

    for name, fill in (("a", b"1"), ("b", b"2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(fill)
    members = [str(tmp_path / "a"), str(tmp_path / "b"), "org/hub-id"]
    before = _path_params({"members": members})
    assert before["members"][2] == "org/hub-id" and before["members"][0] != before["members"][1]
    (tmp_path / "b" / "model.safetensors").write_bytes(b"3")
    assert _path_params({"members": members})["members"][1] != before["members"][1]
    assert _path_params({"members": ["org/hub-id"], "k": 5}) == {}


@pytest.mark.slow
def test_the_runner_scores_an_ensemble_of_two_trainings(digits, tmp_path):
    """`detectors: [{name: ensemble, params: {members: [...]}}]` end to end: the rows equal the metrics of the mean
    logits of the two classifiers' own feature caches."""
    from detectors.harness.evaluate import run_config
    from detectors.metrics import evaluate
    from pipelines.data import read_manifest
    from pipelines.features import extract_features
    from tests.detectors.conftest import train_digits_classifier

    id_dir, ood_dir, model = digits
    second = train_digits_classifier(id_dir, tmp_path / "clf2", seed=1, epochs=1)
    members = [str(model), str(second)]
    config = {"model": str(model), "id": str(id_dir), "ood": [{"manifest": str(ood_dir), "sets": ["texture"]}],
              "out": str(tmp_path / "run"), "detectors": [{"name": "ensemble", "params": {"members": members}}]}
    results = run_config(config)
    row = results[(results.method == "ensemble") & (results.ood_set == "texture")].iloc[0]

    def scores(manifest):
        logits = np.mean([extract_features(ImageClassifier.from_pretrained(m), manifest).to_featureset().logits
                          for m in members], axis=0).astype(np.float64)
        p = np.exp(logits - logits.max(1, keepdims=True))
        return (p / p.sum(1, keepdims=True)).max(1)

    expect = evaluate(scores(read_manifest(id_dir).select(split="test", role="id")),
                      scores(read_manifest(ood_dir).select(split="test", ood_set="texture")))
    for key, value in expect.items():
        assert row[key] == pytest.approx(value, abs=1e-4), key
