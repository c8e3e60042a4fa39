"""ViM's eigen-solver and blocks: torch's eigh on one thread or several gives numpy's ranked subspace; the
covariance's blocks depend on the data's shape only, and the row blocks give the same fit and scores on one thread or
several."""
import numpy as np
import pytest

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc import threads as posthoc_threads
from detectors.posthoc import vim
from detectors.posthoc.vim import ranked_eigenvectors


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("first, stop", [(0, 10), (0, 40), (30, 60), (50, 60), (0, 59)])
def test_both_drivers_give_the_ranked_subspace(first, stop, threads, monkeypatch):
    monkeypatch.setattr(posthoc_threads, "idle_cores", lambda: threads)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 60)) * np.linspace(3, 0.1, 60)
    cov = x.T @ x / 200
    values, vectors = np.linalg.eigh(cov)  # an independent solver, ascending
    expected = vectors[:, ::-1][:, first:stop]
    got = ranked_eigenvectors(cov, first, stop)
    assert got.shape == (60, stop - first) and got.flags.c_contiguous
    np.testing.assert_allclose(got @ got.T, expected @ expected.T, atol=1e-10)  # same subspace
    np.testing.assert_allclose(np.abs(np.sum(got * expected, axis=0)), 1.0, atol=1e-8)  # same order, up to sign


def test_tied_eigenvalues_still_span_the_space():
    cov = np.diag([5.0, 3.0, 3.0, 1.0, 1.0, 1.0])
    got = ranked_eigenvectors(cov, 1, 3)  # the tied pair at 3: any basis of it
    np.testing.assert_allclose(got @ got.T, np.diag([0, 1, 1, 0, 0, 0.0]), atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_threaded_blocks_give_the_serial_fit_and_scores(dtype, monkeypatch):
    rng = np.random.default_rng(3)
    train = (np.maximum(rng.normal(size=(700, 40)) * np.linspace(3, 0.5, 40) + 1, 0)).astype(dtype)
    test = (np.maximum(rng.normal(size=(330, 40)) * 2, 0)).astype(dtype)
    head = LinearHead(rng.normal(size=(6, 40)), rng.normal(size=6))
    monkeypatch.setattr(vim, "SCORE_ROWS", 64)  # many blocks, a short last one
    monkeypatch.setattr(vim, "MOMENT_ROWS", 150)  # 6 blocks of 117 rows
    runs = {}
    for threads in (1, 2, 3):
        monkeypatch.setattr(posthoc_threads, "usable_cores", lambda threads=threads: threads)
        det = detectors.build("vim", dim=10).fit(FeatureSet(train), head=head)
        runs[threads] = det.alpha, det.score(FeatureSet(test))
    for threads in (2, 3):  # blocks summed in order: only the BLAS's own thread split may move the last bits
        assert runs[threads][0] == pytest.approx(runs[1][0], rel=1e-12)
        np.testing.assert_allclose(runs[threads][1], runs[1][1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
def test_second_moment_about_a_point_is_the_float64_formula(threads, monkeypatch):
    monkeypatch.setattr(posthoc_threads, "usable_cores", lambda: threads)
    rng = np.random.default_rng(4)
    x = (rng.normal(size=(1000, 30)) * np.linspace(5, 0.1, 30) + 20).astype(np.float32)  # far from the origin
    point = rng.normal(size=30)
    t = x.astype(np.float64) - point
    expected = t.T @ t / len(x)
    got = vim.second_moment_about(x, point, rows=128)  # 7 full blocks and a short one
    # float32 products of rows centred near their mean: float32 rounding of the (small) spread, not of the offset
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
    with pytest.raises(ValueError, match="no rows"):
        vim.second_moment_about(x[:0], point)


@pytest.mark.parametrize("n", [1, 7, 20000, 100001, 2_900_000])
def test_moment_blocks_are_even_equal_and_bounded(n):
    rows = vim.moment_rows(n)
    count = -(-n // rows)
    assert 1 <= rows <= vim.MOMENT_ROWS
    assert count == 1 or count % 2 == 0  # both cores of a 2-core machine busy to the end
    assert count * rows - n < count  # equal blocks up to rounding


def test_moments_use_their_blocks_whatever_the_threads(monkeypatch):
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(333, 12)) + 3).astype(np.float32)
    monkeypatch.setattr(vim, "MOMENT_ROWS", 40)
    runs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(posthoc_threads, "usable_cores", lambda threads=threads: threads)
        runs.append(vim.second_moment_about(x, np.zeros(12)))
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])  # block order: the same bits
