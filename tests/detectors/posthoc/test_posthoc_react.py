"""ReAct vs an explicit float64 clip-then-energy computation, threshold from id_val (else id_train)."""
import numpy as np
from scipy.special import logsumexp

import detectors
from detectors import FeatureSet, LinearHead


def linear_percentile(values, q):
    """Percentile with linear interpolation between order statistics, by hand."""
    v = np.sort(values.ravel())
    pos = q / 100 * (len(v) - 1)
    lo = int(np.floor(pos))
    return v[lo] + (pos - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])


def test_react_threshold_source_and_energy():
    rng = np.random.default_rng(0)
    train, val, test = (np.abs(rng.normal(size=(n, 10))) for n in (200, 80, 30))
    head = LinearHead(rng.normal(size=(4, 10)), rng.normal(size=4))
    det = detectors.build("react", percentile=80).fit(FeatureSet(train), head=head, id_val=FeatureSet(val))
    threshold = linear_percentile(val, 80)
    assert np.isclose(det.threshold, threshold, rtol=1e-12)
    clipped = np.where(test > threshold, threshold, test)
    expected = [logsumexp(head.weight @ x + head.bias) for x in clipped]
    np.testing.assert_allclose(det.score(FeatureSet(test)), expected, rtol=1e-5)
    assert np.isclose(detectors.build("react").fit(FeatureSet(train), head=head).threshold,
                      linear_percentile(train, 90), rtol=1e-12)


def test_react_at_percentile_100_is_plain_energy():
    rng = np.random.default_rng(1)
    train = rng.normal(size=(50, 6))
    head = LinearHead(rng.normal(size=(3, 6)), rng.normal(size=3))
    det = detectors.build("react", percentile=100).fit(FeatureSet(train), head=head)
    np.testing.assert_allclose(det.score(FeatureSet(train)), logsumexp(train @ head.weight.T + head.bias, axis=1),
                               rtol=1e-5)
