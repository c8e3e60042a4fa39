"""OpenMax: Weibull MLE vs scipy.stats.weibull_min, and the whole recalibration vs a per-sample loop in the style of the
original code (scipy.spatial.distance, weibull_min.cdf, explicit alpha ranks)."""
import numpy as np
import pytest
import scipy.spatial.distance as spd
from scipy.stats import weibull_min

import detectors
from detectors import FeatureSet
from detectors.posthoc.openmax import LIBMR_TRANSLATE, fit_weibull_high, weibull_mle


def test_weibull_mle_matches_scipy_fit():
    data = weibull_min.rvs(1.7, scale=3.0, size=200, random_state=np.random.default_rng(0))
    shape, scale = weibull_mle(data)
    ref_shape, _, ref_scale = weibull_min.fit(data, floc=0)
    assert shape == pytest.approx(ref_shape, rel=1e-4)
    assert scale == pytest.approx(ref_scale, rel=1e-4)


def test_translated_tail_fit_is_a_likelihood_maximum():
    distances = np.random.default_rng(1).gamma(2.0, 1.5, size=50)
    shape, scale, small = fit_weibull_high(distances, tailsize=20)
    tail = np.sort(distances)[-20:]
    assert small == tail[0]
    x = tail + LIBMR_TRANSLATE - small

    def loglik(k, lam):
        return weibull_min.logpdf(x, k, scale=lam).sum()

    best = loglik(shape, scale)
    for k, lam in ((shape * 1.001, scale), (shape / 1.001, scale), (shape, scale * (1 + 1e-6)),
                   (shape, scale * (1 - 1e-6))):
        assert best >= loglik(k, lam)


def _fit_data(seed=0, c=4, per_class=40):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(c), per_class)
    logits = rng.normal(size=(len(labels), c)) + 4.0 * np.eye(c)[labels]
    return logits, labels


def _reference_openmax(det, train_logits, train_labels, test_logits, alpha, distance, eu_weight):
    """Loop implementation: MAVs and tails recomputed here, Weibull CDF by scipy, recalibration per sample and class."""
    c = train_logits.shape[1]

    def dist(a, b):
        if distance == "euclidean":
            return spd.euclidean(a, b)
        if distance == "cosine":
            return spd.cosine(a, b)
        return spd.euclidean(a, b) * eu_weight + spd.cosine(a, b)

    models = []
    for k in range(c):
        rows = [z for z, y in zip(train_logits, train_labels) if y == k and np.argmax(z) == k]
        mav = np.mean(rows, axis=0)
        tail = sorted(dist(mav, z) for z in rows)[-det.params["tailsize"]:]
        shape, scale, small = det.weibull[k]
        assert small == pytest.approx(tail[0], rel=1e-9, abs=1e-12)
        models.append((mav, shape, scale, small))
    out = []
    for v in test_logits:
        ranked = np.argsort(v)[::-1][:alpha]
        omega = np.zeros(c)
        for i, k in enumerate(ranked, start=1):
            omega[k] = (alpha + 1 - i) / alpha
        revised, unknown = [], 0.0
        for k, (mav, shape, scale, small) in enumerate(models):
            w = weibull_min.cdf(dist(mav, v) + LIBMR_TRANSLATE - small, shape, scale=scale)
            revised.append(v[k] * (1 - w * omega[k]))
            unknown += v[k] - revised[-1]
        e = np.exp(np.array(revised + [unknown]))
        out.append(e / e.sum())
    return np.array(out), np.array([m[0] for m in models])


@pytest.mark.parametrize("distance, alpha", [("eucos", 3), ("euclidean", 2), ("cosine", 4)])
def test_openmax_against_loop(distance, alpha):
    train_logits, train_labels = _fit_data()
    rng = np.random.default_rng(5)
    test_logits = np.concatenate([train_logits[::16] + rng.normal(scale=0.5, size=(10, 4)), rng.normal(size=(6, 4))])
    det = detectors.build("openmax", alpha=alpha, distance=distance).fit(FeatureSet(logits=train_logits,
                                                                                    labels=train_labels))
    probs, mavs = _reference_openmax(det, train_logits, train_labels, test_logits, alpha, distance, 1 / 200)
    np.testing.assert_allclose(det.mavs, mavs, rtol=1e-12)
    np.testing.assert_allclose(det.probabilities(test_logits), probs, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(det.score(test_logits), -probs[:, -1], rtol=1e-9, atol=1e-12)  # OpenOOD v1.5's conf
    for score, expected in (("max_known", probs[:, :-1].max(axis=1)), ("max_all", probs.max(axis=1)),
                            ("unknown", 1 - probs[:, -1])):
        other = detectors.build("openmax", alpha=alpha, distance=distance, score=score)
        other.load_state(det.state())
        np.testing.assert_allclose(other.score(test_logits), expected, rtol=1e-9, atol=1e-12)


def test_defaults_are_openood_v15():
    det = detectors.build("openmax")
    assert (det.params["distance"], det.params["score"], det.params["tailsize"], det.params["alpha"]) == (
        "euclidean", "openood", 20, 3)


def test_openood_score_ranks_far_samples_below_while_max_all_inverts_them():
    # a far sample is confidently "unknown": P(unknown) near 1. -P(unknown) ranks it below an ID sample, whereas the
    # max over the C + 1 probabilities (OpenOOD before v1.5) ranks it as the most ID of the two
    train_logits, train_labels = _fit_data(seed=4)
    det = detectors.build("openmax").fit(FeatureSet(logits=train_logits, labels=train_labels))
    typical, far = det.mavs[:1], det.mavs[:1] * 6
    probs = det.probabilities(np.concatenate([typical, far]))
    assert probs[1, -1] > 0.9 > probs[0, -1]
    assert det.score(typical)[0] > det.score(far)[0]
    legacy = detectors.build("openmax", score="max_all")
    legacy.load_state(det.state())
    assert legacy.score(typical)[0] < legacy.score(far)[0]


def test_openmax_far_sample_is_less_id_and_round_trips():
    train_logits, train_labels = _fit_data(seed=3)
    det = detectors.build("openmax").fit(FeatureSet(logits=train_logits, labels=train_labels))
    typical = det.mavs[:1]
    far = det.mavs[:1] * 3 + np.array([[0.0, 6.0, 0.0, 0.0]])
    assert det.score(typical)[0] > det.score(far)[0]


def test_openmax_rejects_bad_parameters_and_empty_classes():
    with pytest.raises(ValueError, match="distance"):
        detectors.build("openmax", distance="manhattan")
    logits = np.array([[2.0, 0.0], [2.5, 0.0], [3.0, 0.0]])
    with pytest.raises(ValueError, match="class 1"):
        detectors.build("openmax").fit(FeatureSet(logits=logits, labels=np.array([0, 0, 0])))


def test_tail_without_spread_gives_the_step_cdf_limit():
    # two samples per class: both lie at the same distance from their mean, so the MLE shape diverges
    logits = np.array([[3.0, 0.0], [5.0, 0.0], [0.0, 3.0], [0.0, 5.0]])
    det = detectors.build("openmax", alpha=1, distance="euclidean").fit(FeatureSet(logits=logits,
                                                                                   labels=np.array([0, 0, 1, 1])))
    assert np.all(np.isinf(det.weibull[:, 0]))
    inside, outside = np.array([[4.5, 0.0]]), np.array([[9.0, 0.0]])  # distance 0.5 and 5 from MAV (4, 0); tail at 1
    assert det.score(inside)[0] == pytest.approx(-np.exp(0.0) / (np.exp(4.5) + 1 + np.exp(0.0)))
    assert det.score(outside)[0] == pytest.approx(-np.exp(9.0) / (1 + 1 + np.exp(9.0)))
