"""MSP, MaxLogit, Energy (ebo) and GEN vs explicit float64 computations written with scipy / per-sample loops."""
import numpy as np
import pytest
from scipy.special import logsumexp as sp_logsumexp
from scipy.special import softmax as sp_softmax

import detectors
from detectors import FeatureSet
from detectors.posthoc.common import log_softmax, logsumexp, softmax


def _logits(seed=0, n=40, c=7, scale=3.0):
    return np.random.default_rng(seed).normal(scale=scale, size=(n, c))


def test_common_numerics_match_scipy_even_for_huge_logits():
    z = _logits(scale=400.0)
    np.testing.assert_allclose(softmax(z), sp_softmax(z, axis=1), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(logsumexp(z), sp_logsumexp(z, axis=1), rtol=1e-12)
    np.testing.assert_allclose(log_softmax(z), z - sp_logsumexp(z, axis=1, keepdims=True), rtol=1e-12)


def test_msp_mls_ebo_against_scipy_and_loops():
    z = _logits(1)
    batch = FeatureSet(logits=z)
    np.testing.assert_allclose(detectors.build("msp").score(batch), [max(sp_softmax(row)) for row in z], rtol=1e-12)
    np.testing.assert_array_equal(detectors.build("mls").score(batch), [max(row) for row in z])
    for t in (1.0, 10.0, 1000.0):
        expected = [t * np.log(np.sum(np.exp(row / t))) for row in z]
        np.testing.assert_allclose(detectors.build("ebo", temperature=t).score(batch), expected, rtol=1e-12)
    scores = detectors.build("ebo").score(z.astype(np.float32))  # raw arrays are accepted too
    assert scores.dtype == np.float64


def test_ordering_invariant_to_a_constant_logit_shift():
    z = _logits(2)
    shifted = z + 123.0
    for name in ("msp", "gen"):
        np.testing.assert_allclose(detectors.build(name).score(shifted), detectors.build(name).score(z), rtol=1e-10)
    for name in ("ebo", "mls"):
        a, b = detectors.build(name).score(z), detectors.build(name).score(shifted)
        np.testing.assert_allclose(b - a, 123.0, rtol=1e-12)
        np.testing.assert_array_equal(np.argsort(a), np.argsort(b))


@pytest.mark.parametrize("gamma, top_m", [(0.1, 100), (0.5, 3), (2.0, 1)])
def test_generalized_entropy_against_explicit_loop(gamma, top_m):
    z = _logits(3, c=9)
    expected = []
    for row in z:
        p = sorted(sp_softmax(row), reverse=True)[:top_m]
        expected.append(-sum(q**gamma * (1 - q) ** gamma for q in p))
    got = detectors.build("gen", gamma=gamma, M=top_m).score(FeatureSet(logits=z))
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_generalized_entropy_confident_beats_uniform_and_rejects_bad_params():
    confident = np.array([[20.0, 0.0, 0.0, 0.0]])
    uniform = np.zeros((1, 4))
    det = detectors.build("gen")
    assert det.score(confident)[0] > det.score(uniform)[0]
    with pytest.raises(ValueError, match="gamma"):
        detectors.build("gen", gamma=0)


def test_registry_lists_group_a_with_declared_metadata():
    names = {"msp", "tempscale", "odin", "ebo", "mls", "klm", "gen", "rp_msp", "rp_ebo", "openmax", "gradnorm", "she"}
    assert names <= set(detectors.available("posthoc"))
    for name in names:
        cls = detectors.detector_class(name)
        assert cls.family == "posthoc" and cls.paper and isinstance(cls.inputs, frozenset)
        assert cls.inputs <= {"logits", "features", "images"}
        assert set(cls.search_space) <= set(cls.defaults)
        detectors.build(name)
    assert detectors.detector_class("gen").search_space["M"] == [10, 50, 100, 200, 500, 1000]
    assert detectors.detector_class("ebo").defaults == {"temperature": 1.0}
    with pytest.raises(TypeError, match="unknown parameter"):
        detectors.build("msp", temperature=2)
