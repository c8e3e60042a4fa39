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
