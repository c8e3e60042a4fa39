"""Entropy and weighted energy (WEBO) against pytorch-ood 0.4.0 itself, a float64 formula by hand, and their edges."""
import numpy as np
import pytest
import torch
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import FeatureSet

RNG = np.random.default_rng(0)
LOGITS = (RNG.normal(size=(64, 7)) * 3).astype(np.float32)


def test_entropy_is_pytorch_oods_negated():
    expected = -pytorch_ood_detector().Entropy(None).predict_logits(torch.from_numpy(LOGITS)).double().numpy()
    ours = detectors.build("Entropy").score(FeatureSet(np.zeros((64, 1)), logits=LOGITS))
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_entropy_by_hand_with_and_without_the_clip():
    z = LOGITS.astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    exact = np.array([sum(q * np.log(q) for q in row if q > 0) for row in p])
    np.testing.assert_allclose(detectors.build("entropy", clip=None).score(z), exact, rtol=1e-12)
    clipped = np.clip(p, 1e-7, 1)
    np.testing.assert_allclose(detectors.build("entropy").score(z), (clipped * np.log(clipped)).sum(1), rtol=1e-12)
    # float32 logits: elementwise in float32 (the model's precision), sums in float64; block boundaries change nothing
    np.testing.assert_allclose(detectors.build("entropy").score(np.tile(LOGITS, (40, 1))),
                               np.tile((clipped * np.log(clipped)).sum(1), 40), rtol=2e-6, atol=1e-7)


def test_entropy_on_many_classes_and_many_blocks():
    # 70 classes are scored row-wise, 7 transposed (FEW_CLASSES); 5,000 rows of 70 span several blocks
    for classes, rows in ((70, 5000), (7, 40000)):
        z = RNG.normal(size=(rows, classes)) * 4
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        clipped = np.clip(p, 1e-7, 1)
        np.testing.assert_allclose(detectors.build("entropy").score(z), (clipped * np.log(clipped)).sum(1),
                                   rtol=1e-12, atol=1e-15)  # atol: near one-hot rows, entropies of 1e-5


def test_entropy_edges():
    det = detectors.build("entropy", clip=None)
    assert det.score(np.zeros((3, 5))) == pytest.approx([-np.log(5)] * 3)  # uniform: the least ID
    assert det.score(np.array([[1e4, 0.0, 0.0]]))[0] == pytest.approx(0.0, abs=1e-12)  # one-hot: no log 0
    assert det.score(np.array([[2.0]]))[0] == 0.0  # a single class
    assert det.score(np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]]))[0] == det.score(np.array([[0.0, 1.0, 1.0]]))[0]
    assert detectors.build("entropy").score(np.zeros((0, 4))).shape == (0,)
    with pytest.raises(ValueError, match="clip"):
        detectors.build("entropy", clip=1.5)


@pytest.mark.parametrize("weights", [None, [0.5, 1.0, 2.0, 0.0, 1.5, -1.0, 3.0]])
def test_webo_is_pytorch_oods_negated(weights):
    w = torch.ones(7) if weights is None else torch.tensor(weights)
    theirs = pytorch_ood_detector().WeightedEBO(None, w).predict_logits(torch.from_numpy(LOGITS)).double().numpy()
    ours = detectors.build("WeightedEBO", weights=weights).score(LOGITS)
    np.testing.assert_allclose(ours, -theirs, rtol=1e-5, atol=1e-5)


def test_webo_by_hand_and_edges():
    z = LOGITS.astype(np.float64)
    w = np.array([0.5, 1.0, 2.0, 0.0, 1.5, -1.0, 3.0])
    by_hand = np.log((np.maximum(w, 0) * np.exp(z)).sum(1))
    np.testing.assert_allclose(detectors.build("webo", weights=list(w)).score(z), by_hand, rtol=1e-12)
    np.testing.assert_allclose(detectors.build("webo").score(z), detectors.build("ebo").score(z), rtol=1e-12)
    big = np.array([[1000.0, 999.0]])  # exp overflows float32 and float64 on the reference's path; not here
    assert detectors.build("webo", weights=[1.0, 2.0]).score(big)[0] == pytest.approx(1000 + np.log(1 + 2 / np.e))
    far = np.array([[0.0, -2000.0]])  # the weight sits on a logit 2000 below the top: the block sum underflows
    assert detectors.build("webo", weights=[0.0, 1.0]).score(far)[0] == pytest.approx(-2000.0)
    np.testing.assert_allclose(detectors.build("webo", weights=list(w)).score(LOGITS), by_hand, rtol=1e-6, atol=1e-6)
    # float32 rows whose exp overflows (> 88) or falls to subnormals (< -87): the float64 formula, not inf or lost bits
    edge = np.stack([LOGITS[0] + 100, LOGITS[1] - 95, LOGITS[2] - 60]).astype(np.float32)
    exact = np.log((np.maximum(w, 0) * np.exp(edge.astype(np.float64))).sum(1))
    np.testing.assert_allclose(detectors.build("webo", weights=list(w)).score(edge), exact, rtol=1e-6)
    assert detectors.build("webo", weights=list(w)).score(LOGITS[:0]).shape == (0,)  # an empty set
    with pytest.raises(ValueError, match="at least one must be > 0"):
        detectors.build("webo", weights=[0.0, -1.0])
    with pytest.raises(ValueError, match="3 weights for logits of 7 classes"):
        detectors.build("webo", weights=[1.0, 1.0, 1.0]).score(z)
    with pytest.raises(ValueError, match="3 given for 7 classes"):
        detectors.detector_class("webo").check_params({"weights": [1.0, 1.0, 1.0]}, dims={"classes": 7, "features": 4})


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_webo_blocks_and_threads_change_nothing_but_rounding(workers, monkeypatch):
    from detectors.posthoc import threads, webo

    w = [0.5, 1.0, 2.0, 0.0, 1.5, -1.0, 3.0]
    whole = detectors.build("webo", weights=w).score(LOGITS)
    monkeypatch.setattr(webo, "SUM_ELEMENTS", 20)  # steps of 2 rows: the product's float32 sums group otherwise
    monkeypatch.setattr(webo, "TASK_ELEMENTS", 50)  # tasks of 7 rows: a short last step in each
    monkeypatch.setattr(threads, "usable_cores", lambda: workers)
    np.testing.assert_allclose(detectors.build("webo", weights=w).score(LOGITS), whole, rtol=1e-6)


def test_webo_sums_float16_logits_in_float32():
    w = [0.5, 1.0, 2.0, 0.0, 1.5, -1.0, 3.0]
    half = LOGITS.astype(np.float16)
    got = detectors.build("webo", weights=w).score(half)
    np.testing.assert_array_equal(got, detectors.build("webo", weights=w).score(half.astype(np.float32)))
    wide = half.astype(np.float64)
    np.testing.assert_allclose(got, np.log((np.maximum(w, 0) * np.exp(wide)).sum(1)), rtol=1e-6)
