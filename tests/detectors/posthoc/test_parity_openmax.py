"""OpenMax against OpenOOD v1.5's postprocessor run with the real libMR (`pip install --no-build-isolation libmr`).

The reference below re-states openood/postprocessors/openmax_postprocessor.py step by step (correctly classified train
logits per class, MAVs, spd.euclidean distances, `libmr.MR().fit_high` on the 20 largest, per-sample recalibration of
the top alpha = 3 classes with `w_score`, the single-channel `compute_openmax_prob`, conf = -P(unknown)), calling
libmr itself, so a different Weibull shift, fit or recalibration in detectors/posthoc/openmax.py shows up here.
"""
import numpy as np
import pytest
import scipy.spatial.distance as spd

import detectors
from detectors import FeatureSet

libmr = pytest.importorskip("libmr", reason="libmr not installed (see .ci/parity_deps)")

TAIL, ALPHA = 20, 3


def openood_fit(logits: np.ndarray, labels: np.ndarray) -> list[tuple[np.ndarray, object]]:
    """OpenOOD's compute_train_score_and_mavs_and_dists + fit_weibull (euclidean): (MAV, libMR model) per class."""
    models = []
    for k in range(logits.shape[1]):
        scores = [z for z, y in zip(logits, labels) if y == k and np.argmax(z) == y]
        mav = np.mean(scores, axis=0)
        mr = libmr.MR()
        tail = np.sort([spd.euclidean(mav, z) for z in scores])[-TAIL:]
        mr.fit_high(tail, len(tail))
        models.append((mav, mr))
    return models


def openood_conf(models: list, logits: np.ndarray) -> np.ndarray:
    """OpenOOD's postprocess: openmax(...) per sample, then conf = -P(unknown)."""
    out = []
    for score in logits:
        c = len(score)
        omega = np.zeros(c)
        omega[score.argsort()[::-1][:ALPHA]] = [(ALPHA + 1 - i) / float(ALPHA) for i in range(1, ALPHA + 1)]
        modified, unknown = [], []
        for k, (mav, mr) in enumerate(models):
            wscore = mr.w_score(spd.euclidean(score, mav))
            modified.append(score[k] * (1 - wscore * omega[k]))
            unknown.append(score[k] - modified[-1])
        denom = np.sum(np.exp(modified)) + np.exp(np.sum(unknown))
        out.append(-np.exp(np.sum(unknown)) / denom)
    return np.array(out)


def _data(seed: int, per_class: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(per_class)), per_class)
    logits = rng.normal(size=(len(labels), len(per_class))) + 3.0 * np.eye(len(per_class))[labels]
    return logits, labels


def _test_logits(seed: int, train: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(seed + 100)
    return np.concatenate([train[::7] + rng.normal(scale=0.7, size=train[::7].shape),
                           rng.normal(scale=2.0, size=(30, train.shape[1]))])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_openmax_scores_match_openood_with_libmr(seed):
    train, labels = _data(seed, (60, 45, 80, 30, 50))
    det = detectors.build("openmax").fit(FeatureSet(logits=train, labels=labels))
    models = openood_fit(train, labels)
    for k, (_, mr) in enumerate(models):  # libMR params: scale, shape, sign, translate_amount, small_score
        scale, shape, _, translate, small = mr.get_params()
        assert translate == 1
        np.testing.assert_allclose(det.weibull[k], [shape, scale, small], rtol=1e-5)
    test = _test_logits(seed, train)
    ours, ref = det.score(test), openood_conf(models, test)
    assert np.abs(ref).max() > 1e-3  # the unknown class takes real mass
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed, libmr_valid", [(6, True), (0, False)])
def test_two_sample_class_fits_and_matches_libmr(seed, libmr_valid):
    # the two correct samples of class 1 lie at one distance from their mean up to rounding. Where rounding sets the
    # two distances apart (seed 6) libMR fits a shape near 1e15, a step, and ours takes the step limit directly: the
    # scores agree. Where they are equal (seed 0) libMR marks the fit invalid (w_score -9999); ours still fits the step
    train, labels = _data(seed, (40, 2, 40))
    assert (train.argmax(1) == labels)[labels == 1].all()
    det = detectors.build("openmax").fit(FeatureSet(logits=train, labels=labels))
    assert np.isinf(det.weibull[1, 0])
    models = openood_fit(train, labels)
    assert models[1][1].is_valid == libmr_valid
    if libmr_valid:
        assert models[1][1].get_params()[1] > 1e12
        test = _test_logits(seed, train)
        np.testing.assert_allclose(det.score(test), openood_conf(models, test), rtol=0, atol=1e-5)
