"""NECO vs scikit-learn StandardScaler + PCA with a per-sample norm-ratio loop (the official code's recipe)."""
import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

import detectors
from detectors import FeatureSet, LinearHead


def data(seed=0):
    rng = np.random.default_rng(seed)
    train = rng.normal(size=(300, 12)) * np.linspace(3.0, 0.3, 12) + 2.0
    return train, rng.normal(size=(50, 12)) + 1.0, LinearHead(rng.normal(size=(5, 12)), rng.normal(size=5))


@pytest.mark.parametrize("scale", [True, False])
def test_neco_matches_sklearn_pipeline(scale):
    train, test, head = data()
    det = detectors.build("neco", dim=4, scale=scale).fit(FeatureSet(train))
    scaler = StandardScaler(with_mean=scale, with_std=scale).fit(train)
    pca = PCA(n_components=train.shape[1]).fit(scaler.transform(train))
    z = scaler.transform(test)
    reduced = pca.transform(z)[:, :4]
    expected = [np.linalg.norm(reduced[i]) / np.linalg.norm(z[i]) for i in range(len(z))]
    np.testing.assert_allclose(det.score(FeatureSet(test)), expected, rtol=1e-8)


def test_neco_max_logit_option_and_known_answer():
    train, test, head = data()
    plain = detectors.build("neco", dim=4).fit(FeatureSet(train))
    weighted = detectors.build("neco", dim=4, max_logit=True).fit(FeatureSet(train), head=head)
    np.testing.assert_allclose(weighted.score(FeatureSet(test)),
                               plain.score(FeatureSet(test)) * (test @ head.weight.T + head.bias).max(1), rtol=1e-5)
    full = detectors.build("neco", dim=11).fit(FeatureSet(train))
    assert (full.score(FeatureSet(test)) <= 1 + 1e-12).all()
    with pytest.raises(ValueError, match="head"):
        detectors.build("neco", max_logit=True).fit(FeatureSet(train))
