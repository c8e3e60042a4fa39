"""GMM against pytorch-ood 0.4.0's `GMM` and scipy's multivariate normal densities (an independent computation), plus
its edges: a class with fewer rows than dimensions (reg), a singular covariance without reg, one class, ties."""
import numpy as np
import pytest
import torch
from helpers.pytorch_ood import pytorch_ood_detector
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

import detectors
from detectors import FeatureSet

RNG = np.random.default_rng(5)
D, C = 6, 3
LABELS = np.repeat(np.arange(C), [60, 40, 100])
CENTRES = RNG.normal(scale=3, size=(C, D))
TRAIN = CENTRES[LABELS] + RNG.normal(size=(200, D)) * RNG.uniform(0.5, 2, size=(C, 1, D))[0]
TEST = np.concatenate([CENTRES[[0, 1, 2, 2]] + RNG.normal(size=(4, D)), RNG.normal(scale=6, size=(20, D))])


def _scipy(train, labels, test, reg=1e-6):
    parts = []
    for c in np.unique(labels):
        rows = train[labels == c]
        cov = np.cov(rows.T, bias=True) + reg * np.eye(train.shape[1])
        parts.append(np.log(len(rows) / len(train)) + multivariate_normal(rows.mean(0), cov).logpdf(test))
    return logsumexp(np.stack(parts, axis=1), axis=1)


def test_gmm_is_pytorch_oods_negated():
    theirs = pytorch_ood_detector().GMM(None)
    theirs.fit_features(torch.from_numpy(TRAIN), torch.from_numpy(LABELS))
    expected = -theirs.predict_features(torch.from_numpy(TEST)).numpy()
    ours = detectors.build("GMM").fit(FeatureSet(TRAIN, labels=LABELS)).score(FeatureSet(TEST))
    np.testing.assert_allclose(ours, expected, rtol=1e-10)


def test_gmm_is_the_mixture_density():
    ours = detectors.build("gmm").fit(FeatureSet(TRAIN, labels=LABELS)).score(FeatureSet(TEST))
    np.testing.assert_allclose(ours, _scipy(TRAIN, LABELS, TEST), rtol=1e-10)


def test_gmm_edges(tmp_path):
    few = np.concatenate([TRAIN[:4], TRAIN[60:160]])  # class 0 has 4 rows in D = 6: reg keeps it definite
    few_labels = np.concatenate([LABELS[:4], LABELS[60:160]])
    ours = detectors.build("gmm", reg=1e-2).fit(FeatureSet(few, labels=few_labels)).score(FeatureSet(TEST))
    np.testing.assert_allclose(ours, _scipy(few, few_labels, TEST, reg=1e-2), rtol=1e-9)
    with pytest.raises(ValueError, match=r"gmm: the covariance of class 0 \(4 rows, D=6\) is not positive definite"):
        detectors.build("gmm", reg=0).fit(FeatureSet(few, labels=few_labels))
    one = detectors.build("gmm").fit(FeatureSet(TRAIN[:60], labels=LABELS[:60]))  # one class: its Gaussian
    np.testing.assert_allclose(one.score(FeatureSet(TEST)), _scipy(TRAIN[:60], LABELS[:60], TEST), rtol=1e-10)
    twice = one.score(FeatureSet(np.concatenate([TEST[:1], TEST[:1]])))
    assert twice[0] == twice[1]  # ties stay ties
    assert one.score(FeatureSet(TEST[:0])).shape == (0,)
    one.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(FeatureSet(TEST)), one.score(FeatureSet(TEST)))


def test_gmm_classes_with_fewer_rows_than_dimensions(tmp_path):
    """D = 24: classes of 3, 6, 12 rows (the low-rank form, n <= D/2) and 40 rows (the Cholesky solve) in one mixture,
    scored on fresh rows and on training rows (which lie in their class's span: only reg's directions remain)."""
    rng = np.random.default_rng(11)
    counts, d = [3, 6, 12, 40], 24
    labels = np.repeat(np.arange(4), counts)
    train = rng.normal(scale=3, size=(4, d))[labels] + rng.normal(size=(len(labels), d)) + 5.0
    test = np.concatenate([rng.normal(size=(30, d)) * 3 + 5.0, train[::4]])
    theirs = pytorch_ood_detector().GMM(None)
    theirs.fit_features(torch.from_numpy(train), torch.from_numpy(labels))
    expected = -theirs.predict_features(torch.from_numpy(test)).numpy()
    ours = detectors.build("gmm").fit(FeatureSet(train, labels=labels))
    assert list(ours.low) == [0, 1, 2] and list(ours.full) == [3]
    np.testing.assert_allclose(ours.score(FeatureSet(test)), expected, rtol=1e-10)
    np.testing.assert_allclose(ours.score(FeatureSet(test)), _scipy(train, labels, test), rtol=1e-10)
    ours.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(FeatureSet(test)), ours.score(FeatureSet(test)))
