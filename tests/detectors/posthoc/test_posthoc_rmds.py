"""RMDS vs a per-sample float64 loop with scikit-learn's EmpiricalCovariance for both Gaussians."""
import numpy as np
from sklearn.covariance import EmpiricalCovariance

import detectors
from detectors import FeatureSet


def clusters(n=240, d=10, c=4, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, n)
    return FeatureSet(rng.normal(0, 3, (c, d))[labels] + rng.normal(0, 1, (n, d)), labels=labels)


def test_rmds_matches_loop_reference():
    train, test = clusters(seed=0), clusters(n=40, seed=1)
    det = detectors.build("rmds").fit(train)
    h, y = train.features.astype(np.float64), train.labels
    means = np.stack([h[y == c].mean(0) for c in range(4)])
    class_precision = EmpiricalCovariance().fit(h - means[y]).precision_
    whole_mean = h.mean(0)
    whole_precision = EmpiricalCovariance().fit(h - whole_mean).precision_
    expected = []
    for x in test.features.astype(np.float64):
        background = (x - whole_mean) @ whole_precision @ (x - whole_mean)
        expected.append(max(-(x - m) @ class_precision @ (x - m) + background for m in means))
    np.testing.assert_allclose(det.score(test), expected, rtol=1e-8, atol=1e-8)


def test_rmds_on_singular_covariances_agrees_with_sklearn():
    """D > N - C (and D > N - 1 for the class-agnostic Gaussian): both precisions are sklearn's pinvh."""
    from tests.detectors.posthoc.singular_helpers import auroc, oracle_scores, singular_case

    train, labels, id_test, ood_test = singular_case(430, 512, seed=1)
    det = detectors.build("rmds").fit(FeatureSet(train, labels=labels))
    ours = det.score(FeatureSet(id_test)), det.score(FeatureSet(ood_test))
    for scores in ours:
        assert np.isfinite(scores).all() and np.unique(scores).size == scores.size
    oracle = oracle_scores(train, labels, id_test, relative=True), oracle_scores(train, labels, ood_test, relative=True)
    assert abs(auroc(*ours) - auroc(*oracle)) < 1e-3
    np.testing.assert_allclose(np.r_[ours], np.r_[oracle], rtol=1e-4, atol=1e-6 * np.abs(np.r_[oracle]).max())
