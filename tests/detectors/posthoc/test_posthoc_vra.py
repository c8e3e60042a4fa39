"""VRA against pytorch-ood 0.4.0's `VRA` (its clipping rule and quantiles passed explicitly) and the official rule
(zeroQiaoba/VRA ood_eval.py:152-160, models/resnet.py:206-209, energy) replayed in float64 by hand, plus its edges."""
import numpy as np
import pytest
import torch
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc.vra import column_quantiles, rectify

RNG = np.random.default_rng(5)
D, C = 24, 4
TRAIN = np.maximum(RNG.normal(size=(61, D)), 0).astype(np.float32) * np.linspace(0.5, 2, D).astype(np.float32)
TEST = (RNG.normal(size=(30, D)) * 1.5 + 0.3).astype(np.float32)  # some below, some above each band
FLOAT32_LERP = np.lib.NumpyVersion(np.__version__) >= "2.4.1"
"""numpy's quantile interpolates float32 input in float32 from 2.4.1 (what `column_quantiles` does: bitwise; checked on
2.0, 2.1, 2.2, 2.3, 2.4.0-2.4.6); before (the floor, 2.0, included) in float64, rounded once: within a few ulps."""
HEAD = LinearHead((RNG.normal(size=(C, D)) * 0.3).astype(np.float32), RNG.normal(size=C).astype(np.float32))


def _ours(train=TRAIN, test=TEST, **params):
    return detectors.build("vra", **params).fit(FeatureSet(train), head=HEAD).score(FeatureSet(test))


def _official(train: np.ndarray, test: np.ndarray, q1: float, q2: float) -> np.ndarray:
    """Sorted columns and numpy's linear rank rule in float64; h < lo -> 0, then > hi -> hi; logsumexp of the head."""
    s, n = np.sort(train.astype(np.float64), axis=0), len(train)

    def quantile(q):
        r = (n - 1) * q
        b = int(np.floor(r))
        return s[b] + (s[min(b + 1, n - 1)] - s[b]) * (r - b)

    lo, hi = quantile(q1), quantile(q2)
    h = test.astype(np.float64)
    h = np.where(h < lo, 0.0, h)
    h = np.where(h > hi, hi, h)
    z = h @ HEAD.weight.T.astype(np.float64) + HEAD.bias
    return z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1))


@pytest.mark.parametrize("low, high", [(0.01, 0.99), (0.1, 0.9), (0.6, 0.9)])
def test_vra_clip_is_pytorch_oods_negated(low, high):
    layer = torch.nn.Linear(D, C)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(HEAD.weight))
        layer.bias.copy_(torch.from_numpy(HEAD.bias))
    theirs = pytorch_ood_detector().VRA(backbone=None, head=layer, lower_percentile=low, upper_percentile=high)
    theirs.fit_feature_maps(torch.from_numpy(TRAIN), torch.zeros(len(TRAIN), dtype=torch.long))
    det = detectors.build("vra", low=low, high=high, below="clip").fit(FeatureSet(TRAIN), head=HEAD)
    for ours, reference in ((det.lower, theirs._lower_threshold), (det.upper, theirs._upper_threshold)):
        _same_quantiles(ours, reference.numpy())  # their np.quantile
    expected = -theirs.predict_feature_maps(torch.from_numpy(TEST)).double().numpy()
    np.testing.assert_allclose(det.score(FeatureSet(TEST)), expected, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("low, high", [(0.6, 0.9), (0.0, 1.0), (0.3, 0.3), (0.15, 0.85)])
def test_vra_is_the_official_rule(low, high):
    np.testing.assert_allclose(_ours(low=low, high=high), _official(TRAIN, TEST, low, high), rtol=1e-5, atol=1e-5)


def test_vra_defaults_and_grids():
    cls = detectors.detector_class("vra")
    assert cls.defaults == {"low": 0.6, "high": 0.9, "below": "zero", "thresholds": "per_feature",
                            "fit_split": "id_train"}  # readme.md:48 (the CIFAR-10 VRA run), ood_eval.py:152
    assert cls.search_space == {"low": [0.01, 0.05, 0.10, 0.15], "high": [0.85, 0.90, 0.95, 0.99]}  # OpenOOD vra.yml
    assert cls.protocol_defaults["openood_v1.5"] == {"low": 0.10, "high": 0.90, "below": "clip",
                                                     "thresholds": "global", "fit_split": "id_val"}
    with pytest.raises(ValueError, match="low"):
        detectors.build("vra", low=0.9, high=0.6)


def _same_quantiles(ours: np.ndarray, numpys: np.ndarray) -> None:
    if FLOAT32_LERP:
        np.testing.assert_array_equal(ours, numpys)
    else:
        np.testing.assert_allclose(ours, numpys, rtol=5e-6, atol=1e-7)


def test_column_quantiles_are_numpys_bitwise():
    for n in (1, 2, 7, 61):
        h = RNG.normal(size=(n, 9)).astype(np.float32)
        for q in (0.0, 0.01, 0.5, 0.6, 0.99, 1.0):
            _same_quantiles(column_quantiles(h, (q,))[0], np.quantile(h, q, axis=0))


def test_vra_edges():
    # one training row: both quantiles are that row; below -> 0, at or above -> the row
    row = TRAIN[:1]
    np.testing.assert_allclose(_ours(train=row), _official(row, TEST, 0.6, 0.9), rtol=1e-5, atol=1e-5)
    # every test feature below its band: all zero, the score is logsumexp(b)
    low_rows = np.full((3, D), -1.0, np.float32)
    expected = np.log(np.exp(HEAD.bias.astype(np.float64)).sum())
    np.testing.assert_allclose(_ours(test=low_rows), np.full(3, expected), rtol=1e-6)
    # an upper quantile below 0: a zeroed value is then above it and becomes it (the official second `where`)
    h, lo, hi = np.array([[-5.0, -5.0]], np.float32), np.array([-3.0, -3.0]), np.array([-2.0, 1.0])
    np.testing.assert_array_equal(rectify(h, lo, hi, "zero"), [[-2.0, 0.0]])
    np.testing.assert_array_equal(rectify(h, lo, hi, "clip"), [[-3.0, -3.0]])
    # ties: a constant column has both quantiles equal to it
    flat = np.tile(TRAIN[:1], (10, 1))
    lo, hi = column_quantiles(flat, (0.1, 0.9))
    np.testing.assert_array_equal(lo, TRAIN[0])
    np.testing.assert_array_equal(hi, TRAIN[0])
    assert _ours(test=TEST[:0]).shape == (0,)
    with pytest.raises(ValueError, match="no id_train features"):
        _ours(train=TRAIN[:0])


def test_vra_state_round_trip(tmp_path):
    det = detectors.build("vra").fit(FeatureSet(TRAIN), head=HEAD)
    det.save_pretrained(tmp_path)
    again = detectors.detector_class("vra").from_pretrained(tmp_path)
    np.testing.assert_array_equal(again.score(FeatureSet(TEST)), det.score(FeatureSet(TEST)))
