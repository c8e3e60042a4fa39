"""SCALE against pytorch-ood 0.4.0's `SCALE` and the official code's rule (kai422/SCALE scale_net.py:29-49) replayed
in float64 by hand, plus its edges."""
import numpy as np
import pytest
import torch
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc.scale import kept_count, scale_ratio

RNG = np.random.default_rng(1)
D, C = 40, 6
TRAIN = np.maximum(RNG.normal(size=(50, D)), 0).astype(np.float32)
TEST = np.maximum(RNG.normal(size=(30, D)) * np.linspace(0.2, 2.0, D), 0).astype(np.float32)
HEAD = LinearHead((RNG.normal(size=(C, D)) * 0.3).astype(np.float32), RNG.normal(size=C).astype(np.float32))


def _ours(percentile=85, test=TEST):
    det = detectors.build("scale", percentile=percentile).fit(FeatureSet(TRAIN), head=HEAD)
    return det.score(FeatureSet(test))


def _official(h: np.ndarray, percentile: float) -> np.ndarray:
    """The official rule in float64: k = n - round(n p / 100); prune all but the top k for s2 only; energy."""
    h = h.astype(np.float64)
    n = h.shape[1]
    k = n - int(np.round(n * percentile / 100.0))
    top = np.sort(h, axis=1)[:, ::-1][:, :k]
    scaled = h * np.exp(h.sum(1) / top.sum(1))[:, None]
    z = scaled @ HEAD.weight.T + HEAD.bias
    return np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)


@pytest.mark.parametrize("percentile", [50, 85, 95])
def test_scale_is_pytorch_oods_negated(percentile):
    pood = pytorch_ood_detector()
    layer = torch.nn.Linear(D, C)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(HEAD.weight.astype(np.float32)))
        layer.bias.copy_(torch.from_numpy(HEAD.bias.astype(np.float32)))
    det = pood.SCALE(backbone=lambda x: x, head=lambda x: layer(x.flatten(1)), percentile=percentile / 100)
    theirs = det.predict_feature_maps(torch.from_numpy(TEST)[:, :, None, None]).double().numpy()
    np.testing.assert_allclose(_ours(percentile), -theirs, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("percentile", [0, 50, 85, 97.5])
def test_scale_is_the_official_rule(percentile):
    np.testing.assert_allclose(_ours(percentile), _official(TEST, percentile), rtol=1e-5, atol=1e-5)


def test_defaults_and_grid_are_the_official_configs():
    cls = detectors.detector_class("scale")
    assert cls.defaults == {"percentile": 85} and cls.search_space == {"percentile": list(range(50, 100, 5))}


def test_scale_edges():
    assert kept_count(10, 85) == 2 and kept_count(10, 90) == 1 and kept_count(4, 62.5) == 2  # round half to even
    assert kept_count(10, 95) == 1  # round(9.5) = 10 would keep none: at least one (pytorch-ood's guard)
    np.testing.assert_allclose(scale_ratio(TEST[:4], 99.9), TEST[:4].sum(1) / TEST[:4].max(1), rtol=1e-6)
    ties = np.array([[1.0, 1.0, 1.0, 1.0]])  # ties: any k of them sum alike
    assert scale_ratio(ties, 50)[0] == 2.0
    zero = np.zeros((2, D), dtype=np.float32)  # an all-zero row: ratio 1 (the reference: 0/0), logits = bias
    np.testing.assert_allclose(_ours(85, zero), np.log(np.exp(HEAD.bias.astype(np.float64)).sum()), rtol=1e-6)
    assert _ours(85, TEST[:0]).shape == (0,)
    with pytest.raises(ValueError, match="percentile"):
        detectors.build("scale", percentile=100)


@pytest.mark.parametrize("name", ["scale", "lts"])
def test_row_blocks_on_any_number_of_threads_give_the_same_scores(name, monkeypatch):
    from detectors.posthoc import lts, scale, threads

    whole = detectors.build(name).fit(FeatureSet(TRAIN), head=HEAD).score(FeatureSet(TEST))
    monkeypatch.setattr(scale, "SCORE_ROWS", 7)  # 5 blocks, a short last one
    monkeypatch.setattr(lts, "SCORE_ROWS", 7)
    runs = []
    for workers in (1, 2, 3):
        monkeypatch.setattr(threads, "usable_cores", lambda workers=workers: workers)
        runs.append(detectors.build(name).fit(FeatureSet(TRAIN), head=HEAD).score(FeatureSet(TEST)))
    assert all(np.array_equal(run, runs[0]) for run in runs)  # the same blocks: the same bits on any threads
    np.testing.assert_allclose(runs[0], whole, rtol=1e-6)  # other blocks: the product's float32 rounding only
