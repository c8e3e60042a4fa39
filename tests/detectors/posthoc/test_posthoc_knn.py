"""KNN vs scikit-learn's exact NearestNeighbors on L2-normalised features."""
import numpy as np
import pytest
from sklearn.neighbors import NearestNeighbors

import detectors
from detectors import FeatureSet


def test_knn_matches_sklearn_kth_distance():
    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(300, 16)), rng.normal(size=(40, 16))
    det = detectors.build("knn", k=7).fit(FeatureSet(train))
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    distances, _ = NearestNeighbors(n_neighbors=7, algorithm="brute").fit(unit(train)).kneighbors(unit(test))
    np.testing.assert_allclose(det.score(FeatureSet(test)), -distances[:, -1], rtol=1e-4, atol=1e-5)


def test_knn_known_answers_and_errors():
    bank = np.eye(4) * np.array([1.0, 2.0, 3.0, 4.0])[:, None]  # normalised: the 4 unit axes
    det = detectors.build("knn", k=1).fit(FeatureSet(bank))
    np.testing.assert_allclose(det.score(FeatureSet(5 * np.eye(4))), 0.0, atol=1e-6)
    np.testing.assert_allclose(det.score(FeatureSet(np.array([[1.0, 1.0, 0.0, 0.0]]))), [-np.sqrt(2 - np.sqrt(2))],
                               rtol=1e-6)
    with pytest.raises(ValueError, match="k=5"):
        detectors.build("knn", k=5).fit(FeatureSet(bank)).score(FeatureSet(bank))
