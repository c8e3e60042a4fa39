"""MDS vs scikit-learn's LDA covariance and scipy's per-sample Mahalanobis distance."""
import numpy as np
import pytest
from scipy.spatial.distance import mahalanobis
from sklearn.covariance import EmpiricalCovariance
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

import detectors
from detectors import FeatureSet


def clusters(n=240, d=12, c=4, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, n)
    centres = rng.normal(0, 3, (c, d))
    mixing = rng.normal(0, 1, (d, d)) / np.sqrt(d)
    return FeatureSet(centres[labels] + rng.normal(0, 1, (n, d)) @ mixing, labels=labels)


def test_mds_matches_lda_covariance_and_scipy_mahalanobis():
    train, test = clusters(seed=0), clusters(n=50, seed=1)
    det = detectors.build("mds").fit(train)
    lda = LinearDiscriminantAnalysis(solver="lsqr", store_covariance=True).fit(train.features, train.labels)
    precision = np.linalg.inv(lda.covariance_)
    np.testing.assert_allclose(det.precision, precision, rtol=1e-8, atol=1e-10)
    expected = [-min(mahalanobis(x, mu, precision) ** 2 for mu in lda.means_) for x in test.features]
    np.testing.assert_allclose(det.score(test), expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(det.score(FeatureSet(lda.means_)), 0.0, atol=1e-9)


def test_point_at_a_class_mean_scores_zero_and_singular_covariance_is_pseudo_inverted():
    train = clusters(d=6)
    features = np.c_[train.features, np.zeros(len(train))]  # a dead unit: singular covariance
    det = detectors.build("mds").fit(FeatureSet(features, labels=train.labels))
    np.testing.assert_allclose(det.precision,
                               EmpiricalCovariance().fit(features - det.means[np.searchsorted(det.classes,
                                                                                              train.labels)]).precision_,
                               rtol=1e-7, atol=1e-9)
    scores = det.score(FeatureSet(det.means))
    np.testing.assert_allclose(scores, 0.0, atol=1e-9)
    assert (det.score(FeatureSet(det.means + 1.0)) < -1e-3).all()


def test_mds_needs_labels():
    with pytest.raises(ValueError, match="labels"):
        detectors.build("mds").fit(FeatureSet(np.zeros((4, 3))))


def test_class_means_with_sparse_label_values():
    features = np.array([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0], [20.0, 2.0], [0.0, 0.0]])
    det = detectors.build("mds").fit(FeatureSet(features, labels=np.array([5, 5, 9, 9, 7])))
    np.testing.assert_array_equal(det.classes, [5, 7, 9])
    np.testing.assert_allclose(det.means, [[2.0, 3.0], [0.0, 0.0], [15.0, 1.0]])


def test_duplicated_unit_gives_the_scores_of_the_reduced_features():
    train, test = clusters(d=5, seed=3), clusters(n=30, d=5, seed=4)
    widen = lambda x: np.c_[x, x[:, :1]]  # noqa: E731  (covariance singular up to rounding)
    reduced = detectors.build("mds").fit(train).score(test)
    duplicated = (detectors.build("mds").fit(FeatureSet(widen(train.features), labels=train.labels))
                  .score(FeatureSet(widen(test.features))))
    np.testing.assert_allclose(duplicated, reduced, rtol=1e-6)


# ResNet-50's pooled features (125 s under load: slow); a stage-4 map flattened
@pytest.mark.parametrize("n, d", [pytest.param(600, 2048, marks=pytest.mark.slow), (430, 512)])
def test_singular_tied_covariance_agrees_with_sklearn(n, d):
    """D > N - C: the precision is pinvh's (sklearn's EmpiricalCovariance), not the inverse of rounding eigenvalues."""
    from tests.detectors.posthoc.singular_helpers import auroc, oracle_scores, singular_case

    train, labels, id_test, ood_test = singular_case(n, d)
    assert d > n - 10
    det = detectors.build("mds").fit(FeatureSet(train, labels=labels))
    ours = det.score(FeatureSet(id_test)), det.score(FeatureSet(ood_test))
    for scores in ours:
        assert np.isfinite(scores).all() and np.unique(scores).size == scores.size
    oracle = oracle_scores(train, labels, id_test), oracle_scores(train, labels, ood_test)
    assert auroc(*oracle) > 0.9  # the structure is there to be found
    assert abs(auroc(*ours) - auroc(*oracle)) < 1e-3
    np.testing.assert_allclose(np.r_[ours], np.r_[oracle], rtol=1e-4)


def test_pinvh_cut_is_scipys():
    """Eigenvalues at or below D * eps * max|lambda| are dropped, those above kept (negative ones too), as pinvh."""
    import scipy.linalg

    from detectors.posthoc.mds import pinvh, pinvh_cutoff, spd_inverse

    rng = np.random.default_rng(0)
    vectors = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    cut = pinvh_cutoff(np.array([4.0]), 6)
    values = np.array([4.0, 1.0, -0.5, 3 * cut, 0.5 * cut, 0.0])
    matrix = (vectors * values) @ vectors.T
    matrix = (matrix + matrix.T) / 2
    ours, (theirs, rank) = pinvh(matrix), scipy.linalg.pinvh(matrix, return_rank=True)
    assert rank == 4  # scipy keeps 3 * cut and drops 0.5 * cut and 0
    # on the eigenvectors: 1 / lambda. The eigenvalue at 3 * cut is itself only known to about eps * max|lambda| ~ 1/18
    # of it (any two LAPACK builds differ there), so its inverse to 20%; its 6e13 leaks into the others' directions by
    # the rounding of the matrix itself (~0.3%), so those to 1%. Kept or dropped differ by orders of magnitude.
    for which, tol in ((slice(0, 3), 1e-2), (slice(3, 4), 0.2)):
        want = 1 / values[which]
        for got in (ours, theirs):
            np.testing.assert_allclose(np.diag(vectors[:, which].T @ got @ vectors[:, which]), want, rtol=tol)
    for got in (ours, theirs):  # 0.5 * cut dropped: kept, it would give about 1 / (0.5 * cut) here
        assert abs(vectors[:, 4] @ got @ vectors[:, 4]) < 0.5 / (3 * cut)
    np.testing.assert_allclose(spd_inverse(matrix), ours, rtol=1e-12)  # not positive definite: the pinvh path
    well = np.cov(rng.normal(size=(50, 6)).T)  # positive definite, well conditioned: the Cholesky path
    np.testing.assert_allclose(spd_inverse(well), scipy.linalg.pinvh(well), rtol=1e-10)
