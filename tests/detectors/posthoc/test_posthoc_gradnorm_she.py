"""GradNorm's closed form vs a per-sample torch autograd backward; SHE vs an explicit loop over stored patterns."""
import numpy as np
import pytest
import torch

import detectors
from detectors import FeatureSet, LinearHead


def _autograd_gradnorm(features, weight, bias):
    """||d KL(u || softmax(W h + b)) / dW||_1 by a float64 backward pass per sample."""
    scores = []
    for h in torch.from_numpy(features):
        w = torch.tensor(weight, dtype=torch.float64, requires_grad=True)
        b = torch.tensor(bias, dtype=torch.float64, requires_grad=True)
        log_p = torch.log_softmax(w @ h + b, dim=0)
        u = torch.full_like(log_p, 1.0 / len(log_p))
        kl = torch.sum(u * (torch.log(u) - log_p))
        kl.backward()
        scores.append(w.grad.abs().sum().item())
    return np.array(scores)


def test_gradnorm_closed_form_matches_autograd():
    rng = np.random.default_rng(0)
    head = LinearHead(rng.normal(size=(5, 8)), rng.normal(size=5))
    train, test = rng.normal(size=(10, 8)), rng.normal(size=(12, 8))
    det = detectors.build("gradnorm").fit(FeatureSet(features=train), head=head)
    expected = _autograd_gradnorm(test, head.weight, head.bias)
    np.testing.assert_allclose(det.score(FeatureSet(features=test)), expected, rtol=1e-10)
    with pytest.raises(ValueError, match="head"):
        detectors.build("gradnorm").fit(FeatureSet(features=train))


def test_she_against_loop_and_round_trip():
    rng = np.random.default_rng(1)
    n, d, c = 80, 6, 3
    features = rng.normal(size=(n, d))
    labels = rng.integers(0, c, size=n)
    logits = rng.normal(size=(n, c)) + 2.0 * np.eye(c)[labels]  # mostly correct, some mistakes
    det = detectors.build("she").fit(FeatureSet(features, logits, labels))
    patterns = []
    for k in range(c):
        rows = [features[i] for i in range(n) if labels[i] == k and np.argmax(logits[i]) == k]
        patterns.append(np.mean(rows, axis=0))
    test_f, test_z = rng.normal(size=(15, d)), rng.normal(size=(15, c))
    expected = [float(np.dot(h, patterns[int(np.argmax(z))])) for h, z in zip(test_f, test_z)]
    batch = FeatureSet(features=test_f, logits=test_z)
    np.testing.assert_allclose(det.score(batch), expected, rtol=1e-12)


def test_she_falls_back_to_all_samples_of_a_never_correct_class():
    features = np.array([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, 4.0]])
    labels = np.array([0, 0, 1, 1])
    logits = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])  # class 1 never predicted
    with pytest.warns(UserWarning, match=r"classes \[1\]"):
        det = detectors.build("she").fit(FeatureSet(features, logits, labels))
    np.testing.assert_allclose(det.patterns, [[2.0, 0.0], [0.0, 3.0]])
