"""SSD against OpenOOD's own statistics (golden/ssd.json, made by golden/make_ssd.py from ssd_postprocessor.py's
setup and mds_ensemble_postprocessor.py's compute_Mahalanobis_score, -0.5 d^2, at the commit it names), SSD's own
one-cluster formula replayed in float64 (eval_ssd.py: normalise, standardise, pinv of np.cov(bias=True)), and its
edges."""
import json
from pathlib import Path

import numpy as np
import pytest

import detectors
from detectors import FeatureSet

GOLDEN = json.loads((Path(__file__).parent / "golden" / "ssd.json").read_text())
TRAIN = np.asarray(GOLDEN["inputs"]["train"], dtype=np.float32)
TEST = np.asarray(GOLDEN["inputs"]["test"], dtype=np.float32)


def _fit(train=TRAIN, **params):
    return detectors.build("ssd", **params).fit(FeatureSet(train))


def _by_hand(train, test, normalize=True):
    """utils.py get_scores_one_cluster after eval_ssd.py's normalisation and standardisation, float64, negated."""
    train, test = train.astype(np.float64), test.astype(np.float64)
    if normalize:
        train = train / (np.linalg.norm(train, axis=1, keepdims=True) + 1e-10)
        test = test / (np.linalg.norm(test, axis=1, keepdims=True) + 1e-10)
    m, s = train.mean(0, keepdims=True), train.std(0, keepdims=True)
    train, test = (train - m) / (s + 1e-10), (test - m) / (s + 1e-10)
    centred = test - train.mean(0, keepdims=True)
    return -np.sum(centred * (np.linalg.pinv(np.cov(train.T, bias=True)) @ centred.T).T, axis=-1)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"rows{c['rows']}")
def test_ssd_is_openoods_fit_with_ssds_distance(case):
    det = _fit(TRAIN[:case["rows"]])
    np.testing.assert_allclose(det.mean, np.reshape(case["mean"], -1), rtol=1e-6, atol=1e-7)
    precision = np.asarray(case["precision"])
    ours = det.score(FeatureSet(TEST))
    if case["rows"] > TRAIN.shape[1]:  # an invertible covariance: the precision and the scores agree
        np.testing.assert_allclose(det.precision, precision, rtol=1e-4, atol=1e-3 * np.abs(precision).max())
        np.testing.assert_allclose(ours, 2.0 * np.asarray(case["scores"]), rtol=1e-4)
        np.testing.assert_allclose(ours, _by_hand(TRAIN, TEST), rtol=1e-6)
    else:  # D > N: float32 rows there, float64 here, the same pinvh rank: compared on the train rows' span
        assert np.linalg.matrix_rank(det.precision) == np.linalg.matrix_rank(precision, tol=1e-3)
        span = _unit(TRAIN[:case["rows"]]) - det.mean  # distances inside the span the fit saw
        theirs = np.einsum("nd,de,ne->n", span, precision, span)
        np.testing.assert_allclose(-det.score(FeatureSet(TRAIN[:case["rows"]])), theirs, rtol=1e-3)


def _unit(h):
    h = h.astype(np.float64)
    return h / np.linalg.norm(h, axis=1, keepdims=True)


def test_ssd_defaults_and_normalize():
    cls = detectors.detector_class("ssd")
    assert cls.defaults == {"normalize": True} and cls.search_space == {}  # ssd.yml's sweep: no set_hyperparam
    raw = _fit(normalize=False).score(FeatureSet(TEST))
    np.testing.assert_allclose(raw, _by_hand(TRAIN, TEST, normalize=False), rtol=1e-6)
    np.testing.assert_allclose(_fit(TRAIN * 7.5).score(FeatureSet(TEST * 0.1)), _by_hand(TRAIN, TEST), rtol=1e-6)
    labelled = detectors.build("ssd").fit(FeatureSet(TRAIN, labels=np.arange(len(TRAIN)) % 4))  # one cluster
    np.testing.assert_array_equal(labelled.score(FeatureSet(TEST)), _fit().score(FeatureSet(TEST)))


def test_ssd_edges():
    # D > N: a singular covariance, pinvh (sklearn's precision); the train rows' distances stay finite and equal SSD's
    few = TRAIN[:5]
    det = _fit(few)
    np.testing.assert_allclose(det.score(FeatureSet(few)), _by_hand(few, few), rtol=1e-6, atol=1e-9)
    # ties: equal rows (and rows along the same ray) score alike; unnormalised, the mean itself scores 0 (the best)
    tied = det.score(FeatureSet(np.stack([TEST[0], TEST[0], 3 * TEST[0]])))
    assert tied[0] == tied[1] and tied[2] == pytest.approx(tied[0], rel=1e-6)
    raw = _fit(normalize=False)
    assert raw.score(FeatureSet(raw.mean[None]))[0] == pytest.approx(0.0, abs=1e-9)
    full = _fit()
    # one training row: a zero covariance, every score 0; a zero feature stays 0 when normalised
    np.testing.assert_array_equal(_fit(TRAIN[:1]).score(FeatureSet(TEST)), 0.0)
    assert np.isfinite(full.score(FeatureSet(np.zeros((1, TRAIN.shape[1]), np.float32)))).all()
    assert full.score(FeatureSet(TEST[:0])).shape == (0,)
    with pytest.raises(ValueError, match="no rows"):
        _fit(TRAIN[:0])


def test_ssd_round_trips(tmp_path):
    det = _fit()
    det.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(FeatureSet(TEST)), det.score(FeatureSet(TEST)))


def test_ssd_streamed_fit_equals_one_chunk():
    from detectors.posthoc import streaming

    with streaming.chunk_rows(1 << 30):
        whole = _fit()
    with streaming.chunk_rows(7):
        chunked = _fit()
        np.testing.assert_allclose(chunked.score(FeatureSet(TEST)), whole.score(FeatureSet(TEST)), rtol=1e-9)
    np.testing.assert_allclose(chunked.mean, whole.mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(chunked.precision, whole.precision, rtol=1e-8, atol=1e-8)
