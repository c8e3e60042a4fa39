"""NCI vs an explicit per-sample float64 loop."""
import numpy as np

import detectors
from detectors import FeatureSet, LinearHead


def test_nci_matches_loop():
    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(100, 9)) + 1, rng.normal(size=(20, 9))
    head = LinearHead(rng.normal(size=(5, 9)), rng.normal(size=5))
    det = detectors.build("nci", alpha=0.01).fit(FeatureSet(train), head=head)
    mu = train.mean(0)
    expected = []
    for h in test:
        w = head.weight[np.argmax(head.weight @ h + head.bias)]
        expected.append(w @ (h - mu) / np.linalg.norm(h - mu) + 0.01 * np.abs(h).sum())
    np.testing.assert_allclose(det.score(FeatureSet(test)), expected, rtol=1e-9)


def test_nci_known_answer_alignment_is_a_cosine_times_weight_norm():
    head = LinearHead(np.array([[2.0, 0.0], [0.0, 1.0]]), np.zeros(2))
    det = detectors.build("nci", alpha=0.0).fit(FeatureSet(np.zeros((2, 2))), head=head)
    np.testing.assert_allclose(det.score(FeatureSet(np.array([[3.0, 0.0], [1.0, 1.0]]))), [2.0, 2.0 / np.sqrt(2)],
                               rtol=1e-12)
