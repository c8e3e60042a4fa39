"""fDBD vs an explicit per-sample, per-class loop over ||w_y - w_k||."""
import numpy as np
import pytest

import detectors
from detectors import FeatureSet, LinearHead


@pytest.mark.parametrize("distance", [True, False])
def test_fdbd_matches_loop(distance):
    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(100, 9)) + 1, rng.normal(size=(20, 9))
    head = LinearHead(rng.normal(size=(5, 9)), rng.normal(size=5))
    det = detectors.build("fdbd", distance_as_normalizer=distance).fit(FeatureSet(train), head=head)
    mu = train.mean(0) if distance else np.zeros(9)
    expected = []
    for h in test:
        z = head.weight @ h + head.bias
        y = int(np.argmax(z))
        total = sum(abs(z[y] - z[k]) / np.linalg.norm(head.weight[y] - head.weight[k]) for k in range(5) if k != y)
        expected.append(total / np.linalg.norm(h - mu))
    np.testing.assert_allclose(det.score(FeatureSet(test)), expected, rtol=1e-5)


def test_fdbd_known_answer_two_classes():
    # two classes with w = (+-1, 0), b = 0: the only boundary is x1 = 0; distance |z_0 - z_1| / ||w_0 - w_1|| = |x1|
    head = LinearHead(np.array([[1.0, 0.0], [-1.0, 0.0]]), np.zeros(2))
    det = detectors.build("fdbd", distance_as_normalizer=False).fit(FeatureSet(np.zeros((3, 2))), head=head)
    np.testing.assert_allclose(det.score(FeatureSet(np.array([[3.0, 4.0], [-1.0, 0.0]]))), [3 / 5, 1.0], rtol=1e-6)
