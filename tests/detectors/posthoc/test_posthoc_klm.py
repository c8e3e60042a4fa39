"""KL-Matching vs scipy.stats.entropy in explicit loops; templates from id_val when given; state round-trip."""
import numpy as np
import pytest
from scipy.special import softmax
from scipy.stats import entropy

import detectors
from detectors import FeatureSet


def _reference_klm(fit_logits, test_logits):
    probs = softmax(fit_logits, axis=1)
    pred = probs.argmax(axis=1)
    templates = [probs[pred == k].mean(axis=0) for k in range(fit_logits.shape[1]) if np.any(pred == k)]
    return np.array([-min(entropy(p, q) for q in templates) for p in softmax(test_logits, axis=1)])


def test_klm_against_scipy_entropy_loop():
    rng = np.random.default_rng(0)
    train, val, test = (rng.normal(scale=2.0, size=(n, 5)) for n in (120, 90, 30))
    det = detectors.build("klm").fit(FeatureSet(logits=train), id_val=FeatureSet(logits=val))
    np.testing.assert_allclose(det.score(FeatureSet(logits=test)), _reference_klm(val, test), rtol=1e-10, atol=1e-12)
    train_only = detectors.build("klm").fit(FeatureSet(logits=train))
    np.testing.assert_allclose(train_only.score(test), _reference_klm(train, test), rtol=1e-10, atol=1e-12)


def test_klm_known_answer_and_unpredicted_classes():
    # every fitting sample is predicted as class 0 with the same softmax: the template equals it, KL = 0
    fit = np.tile([[3.0, 0.0, -1.0]], (10, 1))
    with pytest.warns(UserWarning, match="never predicted"):
        det = detectors.build("klm").fit(FeatureSet(logits=fit))
    np.testing.assert_array_equal(det.template_classes, [0])
    np.testing.assert_allclose(det.score(fit[:2]), 0.0, atol=1e-12)
    assert det.score(np.array([[0.0, 0.0, 5.0]]))[0] < -1.0
