"""ViM vs the official recipe: EmpiricalCovariance(assume_centered) on h - u, np.linalg.eig, explicit null-space
basis."""
import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.covariance import EmpiricalCovariance

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc.vim import principal_dim


def setup(n=400, d=16, c=6, seed=0):
    rng = np.random.default_rng(seed)
    # anisotropic features so the principal subspace is well separated from the residual one
    train = rng.normal(size=(n, d)) * np.linspace(4.0, 0.5, d) + 1.0
    test = rng.normal(size=(60, d)) * 2.0
    return train, test, LinearHead(rng.normal(size=(c, d)), rng.normal(size=c))


def official_vim(train, test, head, dim):
    w, b = head.weight, head.bias
    u = -np.linalg.pinv(w) @ b
    cov = EmpiricalCovariance(assume_centered=True).fit(train - u).covariance_
    values, vectors = np.linalg.eig(cov)
    null = np.ascontiguousarray(vectors.T[np.argsort(-values)[dim:]].T.real)
    alpha = (train @ w.T + b).max(axis=1).mean() / np.linalg.norm((train - u) @ null, axis=1).mean()
    return logsumexp(test @ w.T + b, axis=1) - alpha * np.linalg.norm((test - u) @ null, axis=1)


@pytest.mark.parametrize("dim", [3, 12])  # principal basis kept / null basis kept
def test_vim_matches_official_recipe(dim):
    train, test, head = setup()
    det = detectors.build("vim", dim=dim).fit(FeatureSet(train), head=head)
    np.testing.assert_allclose(det.score(FeatureSet(test)), official_vim(train, test, head, dim), rtol=1e-5, atol=1e-5)


def test_vim_dim_rule_and_errors():
    assert [principal_dim(d) for d in (16, 768, 2048)] == [8, 256, 1000]
    train, _, head = setup()
    with pytest.raises(ValueError, match="dim=16"):
        detectors.build("vim", dim=16).fit(FeatureSet(train), head=head)
    with pytest.raises(ValueError, match="head"):
        detectors.build("vim").fit(FeatureSet(train))


@pytest.mark.parametrize("shape", [(4, 9), (9, 4), (4, 4)])
def test_virtual_origin_is_minus_pinv_w_b_full_rank_or_not(shape):
    from detectors.posthoc.vim import virtual_origin

    rng = np.random.default_rng(2)
    w, b = rng.normal(size=shape), rng.normal(size=shape[0])
    np.testing.assert_allclose(virtual_origin(w, b), -np.linalg.pinv(w) @ b, rtol=1e-8, atol=1e-10)
    w[1] = w[0]  # rank deficient: the Gram matrix is singular, the SVD path answers
    np.testing.assert_allclose(virtual_origin(w, b), -np.linalg.pinv(w) @ b, rtol=1e-8, atol=1e-10)
