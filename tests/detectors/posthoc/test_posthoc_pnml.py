"""pNML against pytorch-ood 0.4.0's `PNML` and the official code's regret (kobybibas/pnml_ood_detection
baseline_lit_utils.py:184-202) replayed in float64 by hand, plus its edges."""
import numpy as np
import pytest
import torch
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc.pnml import cholesky_inverse, hermitian_pinv, regret

RNG = np.random.default_rng(4)
D, C = 24, 5
HEAD = LinearHead((RNG.normal(size=(C, D)) * 2).astype(np.float32), RNG.normal(size=C).astype(np.float32))
TRAIN = np.maximum(RNG.normal(size=(500, D)) + 0.3, 0).astype(np.float32)
TEST = np.maximum(RNG.normal(size=(50, D)) * np.linspace(0.2, 3, D), 0).astype(np.float32)


def _official(train: np.ndarray, test: np.ndarray) -> np.ndarray:
    norm = lambda h: h.astype(np.float64) / np.linalg.norm(h.astype(np.float64), axis=1, keepdims=True)  # noqa: E731
    x, f = norm(train), norm(test)
    inverse = np.linalg.pinv(x.T @ x, rcond=1e-15)
    proj = np.abs(np.einsum("nd,de,ne->n", f, inverse, f))
    g = proj / (1 + proj)
    z = f @ HEAD.weight.T + HEAD.bias
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return 1 - np.log((p / (p + (1 - p) * p ** g[:, None])).sum(1)) / np.log(C)  # main_score.py:63: 1 - regret


def test_pnml_is_pytorch_oods_negated():
    layer = torch.nn.Linear(D, C)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(HEAD.weight.astype(np.float32)))
        layer.bias.copy_(torch.from_numpy(HEAD.bias.astype(np.float32)))
    theirs = pytorch_ood_detector().PNML(None, head=layer)
    theirs.fit_features(torch.from_numpy(TRAIN), torch.zeros(len(TRAIN), dtype=torch.long))
    expected = -theirs.predict_features(torch.from_numpy(TEST)).double().numpy()
    ours = detectors.build("PNML").fit(FeatureSet(TRAIN), head=HEAD).score(FeatureSet(TEST))
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)


def test_pnml_is_the_official_regret():
    ours = detectors.build("pnml").fit(FeatureSet(TRAIN), head=HEAD).score(FeatureSet(TEST))
    np.testing.assert_allclose(1 + ours, _official(TRAIN, TEST), rtol=1e-5, atol=1e-6)


def test_regret_edges():
    uniform = np.log(np.full((2, 4), 0.25))
    assert regret(uniform, np.zeros(2)) == pytest.approx([0.0, 0.0])  # g = 0: the terms are p, summing to 1
    assert regret(uniform, np.ones(2)) == pytest.approx([np.log(4 / 1.75) / np.log(4)] * 2)  # g = 1: 1 / (2 - p)
    one_hot = np.log(np.array([[1.0 - 3e-300, 1e-300, 1e-300, 1e-300]]))
    assert regret(one_hot, np.array([0.5]))[0] == pytest.approx(0.0, abs=1e-12)  # confident, g < 1: no regret
    underflow = np.array([[0.0, -np.inf, -np.inf]])  # p = 0 exactly: the term's limit 0, no NaN
    assert regret(underflow, np.array([0.3]))[0] == pytest.approx(0.0, abs=1e-12)
    assert np.all(regret(np.zeros((2, 1)), np.array([0.1, 0.9])) == 0)  # one class
    ties = np.log(np.array([[0.5, 0.5], [0.5, 0.5]]))
    assert regret(ties, np.array([0.2, 0.2]))[0] == regret(ties, np.array([0.2, 0.2]))[1]


def test_the_pseudo_inverse_is_numpys():
    x = RNG.normal(size=(8, 12))
    for gram in (x.T @ x, x @ x.T + np.eye(8)):  # singular (rank 8 of 12) and regular
        np.testing.assert_allclose(hermitian_pinv(gram, 1e-10), np.linalg.pinv(gram, rcond=1e-10, hermitian=True),
                                   atol=1e-10)


def test_the_cholesky_inverse_stands_in_only_where_it_is_the_pseudo_inverse():
    x = RNG.normal(size=(40, 12))
    regular = x.T @ x
    np.testing.assert_allclose(cholesky_inverse(regular, 1e-15), np.linalg.pinv(regular, rcond=1e-15, hermitian=True),
                               rtol=1e-12, atol=1e-14)
    assert cholesky_inverse(x[:8].T @ x[:8], 1e-15) is None  # singular (rank 8 of 12): the eigh drops the null space
    assert cholesky_inverse(np.diag([1.0, 1e-9]), 1e-15) is None  # condition 1e9: left to the eigh
    assert cholesky_inverse(np.zeros((0, 0)), 1e-15) is None
    # rcond above the smallest eigenvalue's share: the eigh drops it, the inverse would not
    assert cholesky_inverse(np.diag([1.0, 1e-3]), 1e-2) is None
    np.testing.assert_array_equal(hermitian_pinv(np.diag([1.0, 1e-3]), 1e-2), np.diag([1.0, 0.0]))


def test_pnml_with_more_dimensions_than_rows_and_empty_sets():
    wide = np.maximum(RNG.normal(size=(10, D)), 0).astype(np.float32)  # D > N: X^T X singular, pseudo-inverted
    det = detectors.build("pnml").fit(FeatureSet(wide), head=HEAD)
    scores = det.score(FeatureSet(TEST))
    assert np.all(np.isfinite(scores)) and np.all(scores <= 1e-12)  # the regret lies in [0, 1]
    assert det.score(FeatureSet(TEST[:0])).shape == (0,)
