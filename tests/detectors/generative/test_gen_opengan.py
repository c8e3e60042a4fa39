"""OpenGAN: architecture as published, learning on separable features, epoch selection, BN modes, save/load."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import detectors
from detectors import FeatureSet
from detectors.generative.opengan import Discriminator, Generator, init_weights
from detectors.metrics import auroc


def blobs(n: int, center: float, dim: int = 16, seed: int = 0) -> FeatureSet:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, dim)) + center
    return FeatureSet(features=x.astype(np.float32))


def test_architecture_and_init():
    g, d = Generator(40), Discriminator(40)
    g.apply(init_weights)
    d.apply(init_weights)
    g_sizes = [(m.in_features, m.out_features, m.bias is not None) for m in g.modules() if isinstance(m, torch.nn.Linear)]
    d_sizes = [(m.in_features, m.out_features, m.bias is not None) for m in d.modules() if isinstance(m, torch.nn.Linear)]
    assert g_sizes == [(100, 512, False), (512, 256, False), (256, 128, False), (128, 256, False), (256, 40, True)]
    assert d_sizes == [(40, 512, False), (512, 256, False), (256, 128, False), (128, 64, False), (64, 1, False)]
    bn_d = [m.num_features for m in d.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    assert bn_d == [256, 128, 64]  # no BN after the first layer
    weights = torch.cat([m.weight.flatten() for m in d.modules() if isinstance(m, torch.nn.Linear)])
    assert abs(float(weights.detach().std()) - 0.02) < 0.002
    bn_w = torch.cat([m.weight for m in d.modules() if isinstance(m, torch.nn.BatchNorm1d)])
    assert abs(float(bn_w.detach().mean()) - 1.0) < 0.01


def mixed_auroc(det, id_set: FeatureSet, ood_set: FeatureSet) -> float:
    scores = det.score(FeatureSet(features=np.concatenate([id_set.features, ood_set.features])))
    return auroc(scores[: len(id_set)], scores[len(id_set):])


def test_separable_features_and_bn_modes():
    train, id_val, ood_val = blobs(512, 0.0, seed=1), blobs(128, 0.0, seed=2), blobs(128, 3.0, seed=3)
    det = detectors.build("opengan", epochs=5)
    det.fit(train, id_val=id_val, ood_val=ood_val, outliers=blobs(256, 3.0, seed=4))
    test_id, test_ood = blobs(200, 0.0, seed=5), blobs(200, 3.0, seed=6)
    eval_auroc = mixed_auroc(det, test_id, test_ood)
    assert eval_auroc > 0.95
    assert auroc(det.score(test_id), det.score(test_ood)) == pytest.approx(eval_auroc, abs=1e-12)  # per-sample scores
    # BN with batch statistics: scores depend on what is scored together, and rank worse (why "eval" is the default)
    det.params["bn_mode"] = "batch"
    alone = det.score(test_id)
    together = det.score(FeatureSet(features=np.concatenate([test_id.features, test_ood.features])))[:200]
    assert np.abs(alone - together).max() > 1e-3
    assert mixed_auroc(det, test_id, test_ood) < eval_auroc


def test_model_selection_keeps_the_best_validation_epoch():
    # the official separate forward passes learn slowly on a pure mean shift, so the validation AUROC varies by epoch
    train, id_val, ood_val = blobs(512, 0.0, seed=1), blobs(128, 0.0, seed=2), blobs(128, 3.0, seed=3)
    det = detectors.build("opengan", epochs=15, seed=0, joint_batches=False)
    det.fit(train, id_val=id_val, ood_val=ood_val, outliers=blobs(256, 3.0, seed=4))
    aurocs = [h["auroc"] for h in det.history]
    assert len(aurocs) == 15 and max(aurocs) > aurocs[-1]  # the last epoch is not the best one here
    assert det.best_epoch == int(np.argmax(aurocs))
    assert det.validation_auroc(id_val, ood_val) == pytest.approx(max(aurocs), abs=1e-12)
    joint = detectors.build("opengan", epochs=15, seed=0).fit(train, id_val=id_val, ood_val=ood_val, outliers=blobs(256, 3.0, seed=4))
    assert max(h["auroc"] for h in joint.history) >= max(aurocs)


def test_opengan0_without_outliers_keeps_last_epoch_without_validation():
    train = blobs(256, 0.0, seed=1)
    det = detectors.build("opengan", epochs=3).fit(train)
    assert det.best_epoch == 2 and len(det.history) == 3 and "auroc" not in det.history[0]
    assert np.isfinite(det.score(train)).all()
    only_id_val = detectors.build("opengan", epochs=2).fit(train, id_val=train)
    assert only_id_val.best_epoch == 1 and "auroc" not in only_id_val.history[0]


def test_save_load_round_trip(tmp_path):
    det = detectors.build("opengan", epochs=2).fit(blobs(256, 0.0), id_val=blobs(64, 0.0, seed=2), ood_val=blobs(64, 3.0, seed=3))
    test = blobs(50, 1.0, seed=9)
    loaded = detectors.Detector.from_pretrained(det.save_pretrained(tmp_path / "og"))
    np.testing.assert_array_equal(loaded.score(test), det.score(test))
    assert loaded.params == det.params
