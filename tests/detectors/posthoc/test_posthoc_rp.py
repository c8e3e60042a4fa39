"""RP-MSP and RP-EBO vs explicit loops with the empirical class prior; uniform prior reduces RP-MSP to MSP - 1/C."""
import numpy as np
import pytest
from scipy.special import logsumexp, softmax

import detectors
from detectors import FeatureSet


def _data(seed=0, n=60, c=4):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(n, c))
    labels = rng.choice(c, size=n, p=[0.55, 0.25, 0.15, 0.05][:c])
    return logits, labels


def test_rp_msp_and_rp_ebo_against_loops():
    logits, labels = _data()
    train = FeatureSet(logits=logits, labels=labels)
    prior = np.array([np.mean(labels == k) for k in range(4)])
    test = _data(1, n=20)[0]
    expected_msp, expected_ebo = [], []
    for z in test:
        p = softmax(z)
        expected_msp.append(max(p[k] - prior[k] for k in range(4)))
        cos = sum(p[k] * prior[k] for k in range(4)) / (np.sqrt(sum(p**2)) * np.sqrt(sum(prior**2)))
        expected_ebo.append(2.0 * logsumexp(z / 2.0) * (1 - cos))
    rp_msp = detectors.build("rp_msp").fit(train)
    rp_ebo = detectors.build("rp_ebo", temperature=2.0).fit(train)
    np.testing.assert_allclose(rp_msp.prior, prior, rtol=1e-15)
    np.testing.assert_allclose(rp_msp.score(FeatureSet(logits=test)), expected_msp, rtol=1e-12)
    np.testing.assert_allclose(rp_ebo.score(FeatureSet(logits=test)), expected_ebo, rtol=1e-12)


def test_rp_msp_with_uniform_prior_is_msp_minus_one_over_c_and_needs_fit():
    logits = np.random.default_rng(2).normal(size=(30, 3))
    labels = np.repeat(np.arange(3), 10)
    det = detectors.build("rp_msp").fit(FeatureSet(logits=logits, labels=labels))
    np.testing.assert_allclose(det.score(logits), detectors.build("msp").score(logits) - 1 / 3, rtol=1e-12)
    with pytest.raises(RuntimeError, match="fit"):
        detectors.build("rp_ebo").score(logits)
    with pytest.raises(ValueError, match="labels"):
        detectors.build("rp_msp").fit(FeatureSet(logits=logits))
