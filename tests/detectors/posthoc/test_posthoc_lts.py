"""LTS against pytorch-ood 0.4.0's `LTS` and the official code's rule (andrijazz/lts lts.py:61-72, energy of the
scaled logits) replayed in float64 by hand, plus its edges."""
import numpy as np
import pytest
import torch
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc.lts import lts_factor

RNG = np.random.default_rng(2)
D, C = 48, 5
TEST = (RNG.normal(size=(40, D)) * np.linspace(0.3, 2.0, D)).astype(np.float32)  # negative entries: relu matters
HEAD = LinearHead((RNG.normal(size=(C, D)) * 0.2).astype(np.float32), RNG.normal(size=C).astype(np.float32))


def _ours(test=TEST, **params):
    det = detectors.build("lts", **params).fit(FeatureSet(TEST[:5]), head=HEAD)
    return det.score(FeatureSet(test))


def _official(h: np.ndarray, percentile: float) -> np.ndarray:
    h = h.astype(np.float64)
    r = np.maximum(h, 0)
    k = D - int(np.round(D * percentile / 100.0))
    s = (r.sum(1) / np.sort(r, axis=1)[:, ::-1][:, :k].sum(1)) ** 2
    z = (h @ HEAD.weight.T + HEAD.bias) * s[:, None]
    return z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1))


@pytest.mark.parametrize("percentile", [65, 90, 95])
def test_lts_is_pytorch_oods_negated(percentile):
    layer = torch.nn.Linear(D, C)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(HEAD.weight.astype(np.float32)))
        layer.bias.copy_(torch.from_numpy(HEAD.bias.astype(np.float32)))
    det = pytorch_ood_detector().LTS(encoder=None, head=layer, p=1 - percentile / 100)
    theirs = det.predict_features(torch.from_numpy(TEST)).double().numpy()
    np.testing.assert_allclose(_ours(percentile=percentile), -theirs, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("percentile", [0, 50, 95])
def test_lts_is_the_official_rule(percentile):
    np.testing.assert_allclose(_ours(percentile=percentile), _official(TEST, percentile), rtol=1e-5, atol=1e-5)


def test_lts_defaults_and_edges():
    cls = detectors.detector_class("lts")
    assert cls.defaults == {"percentile": 95} and cls.search_space == {}  # the official configs: lts@95, no sweep
    assert lts_factor(np.array([[2.0, 2.0, -5.0, 0.0]]), 50)[0] == pytest.approx(1.0)  # top 2 hold it all
    assert lts_factor(np.array([[1.0, 1.0, 1.0, 1.0]]), 50)[0] == pytest.approx(4.0)  # ties
    negative = -np.abs(TEST[:3])  # no positive activation: factor 1 (the official code: 0/0), plain energy
    expected = np.log(np.exp(HEAD(negative.astype(np.float64))).sum(1))
    np.testing.assert_allclose(_ours(negative), expected, rtol=1e-5)
    assert _ours(TEST[:0]).shape == (0,)
    small = TEST[:6, :8]  # D = 8 at 95: round(7.6) = 8 would keep none; the largest one decides (pytorch-ood's guard)
    r = np.maximum(small.astype(np.float64), 0)
    np.testing.assert_allclose(lts_factor(small, 95), (r.sum(1) / r.max(1)) ** 2, rtol=1e-6)
