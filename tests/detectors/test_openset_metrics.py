"""detectors.openset_metrics against an independent statement of the Open-Insect evaluator's formulas
(src/openood/evaluators/metrics.py at e0aa51e) written here with scikit-learn as the reference calls it and plain loops,
and OpenAUC against XCurve 1.1.0 itself where it is installed (`.ci/parity_deps`: --no-deps, torchvision unneeded).
Inputs: random, tied and degenerate scores."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

from detectors import openset_metrics as om


# -- the reference's formulas, stated independently (float64, loops, scikit-learn) ---------------------------------
def _conf_label(id_conf, ood_conf, labels):
    return np.r_[id_conf, ood_conf], np.r_[labels, -np.ones(len(ood_conf), dtype=np.int64)]


def ref_tnr(conf, label, fnr):
    fpr, tpr, _ = skm.roc_curve((label == -1).astype(int), -conf)
    first = next(i for i, t in enumerate(tpr) if t >= 1 - fnr)
    return 1 - fpr[first]


def ref_auroc_aupr_fpr(conf, label):
    y = (label == -1).astype(int)
    fpr, tpr, _ = skm.roc_curve(y, -conf)
    first = next(i for i, t in enumerate(tpr) if t >= 0.95)
    return skm.roc_auc_score(y, -conf), skm.average_precision_score(y, -conf), fpr[first]


def ref_auoscr(known, unknown, pred, labels):
    """The OSCR curve walked one cut at a time: rows in argsort order of conf (known first), a cut after position k."""
    values = np.concatenate([known, unknown])
    hit = np.concatenate([(pred == labels).astype(float), np.zeros(len(unknown))])
    is_unknown = np.concatenate([np.zeros(len(known)), np.ones(len(unknown))])
    order = values.argsort()
    hit, is_unknown = hit[order], is_unknown[order]
    n = len(values)
    points = []
    for k in range(n - 1):
        points.append((sum(is_unknown[k:]) / len(unknown), sum(hit[k + 1:]) / len(known)))
    points += [(0.0, 0.0), (0.0, 0.0), (1.0, 1.0)]
    points.sort(reverse=True)
    area = 0.0
    for (f0, c0), (f1, c1) in zip(points, points[1:]):
        area += (f0 - f1) * ((c0 + c1) / 2.0)
    return area


def ref_openauc(known, unknown, pred, labels):
    """XCurve's OpenAUC on the reference's -conf: misclassified known rows at max(unknown) + 1e-5."""
    s_known, s_unknown = -known, -unknown
    top = max(s_unknown.tolist()) + 1e-5
    scores = [s if ok else top for s, ok in zip(s_known.tolist(), (pred == labels).tolist())] + s_unknown.tolist()
    return skm.roc_auc_score([0] * len(known) + [1] * len(unknown), scores)


def ref_osa_at(known, unknown, pred, labels, theta):
    ccr = sum(1 for s, p, y in zip(known, pred, labels) if p == y and s >= theta) / len(known)
    urr = sum(1 for s in unknown if s < theta) / len(unknown)
    return 0.5 * ccr + 0.5 * urr


def ref_osa_threshold(known, unknown, pred, labels):
    best, best_theta = -1.0, None
    for theta in sorted(set(np.concatenate([known, unknown]).tolist())):
        value = ref_osa_at(known, unknown, pred, labels, theta)
        if value > best:  # the first (lowest) threshold of a tie, as np.argmax over ascending np.unique
            best, best_theta = value, theta
    return best, best_theta


def ref_all(id_conf, ood_conf, pred, labels, theta):
    conf, label = _conf_label(id_conf, ood_conf, labels)
    auroc, aupr, fpr = ref_auroc_aupr_fpr(conf, label)
    out = {"TNR@10": ref_tnr(conf, label, 0.1), "TNR@20": ref_tnr(conf, label, 0.2), "AUROC": auroc, "AUPR": aupr,
           "FPR": fpr, "ACC": float(np.mean(pred == labels)),
           "AUOSCR": ref_auoscr(id_conf, ood_conf, pred, labels),
           "OpenAUC": ref_openauc(id_conf, ood_conf, pred, labels)}
    if theta:
        out["OSA"] = ref_osa_threshold(id_conf, ood_conf, pred, labels)[0]
        out["OOSA"] = ref_osa_at(id_conf, ood_conf, pred, labels, theta)
    else:
        out["OSA"] = out["OOSA"] = float("nan")
    return out


def ours_all(id_conf, ood_conf, pred, labels, theta):
    got = om.reference_metrics(id_conf, ood_conf, om.Predictions(pred, labels), theta)
    got["auroc"] = om.auroc(id_conf, ood_conf)
    got["id_acc"] = om.accuracy(pred, labels)
    return {ref: got[ours] for ref, ours in om.OOD_CSV_COLUMNS.items()}


# -- cases ----------------------------------------------------------------------------------------------------------
def _random(seed, n_id=40, n_ood=30, classes=4, ties=False):
    rng = np.random.default_rng(seed)
    id_conf, ood_conf = rng.normal(1.0, 1.0, n_id), rng.normal(0.0, 1.0, n_ood)
    if ties:
        id_conf, ood_conf = np.round(id_conf * 2) / 2, np.round(ood_conf * 2) / 2
    labels = rng.integers(0, classes, n_id)
    pred = np.where(rng.random(n_id) < 0.7, labels, rng.integers(0, classes, n_id))
    return id_conf, ood_conf, pred, labels


def _cases():
    cases = {f"random{s}": _random(s) for s in range(4)}
    cases |= {f"tied{s}": _random(10 + s, ties=True) for s in range(4)}
    cases["small"] = _random(20, n_id=3, n_ood=2)
    cases["one_id_sample"] = _random(21, n_id=1, n_ood=5)
    cases["all_equal"] = (np.full(6, 0.3), np.full(4, 0.3), np.array([0, 1, 0, 1, 0, 1]), np.array([0, 1, 1, 1, 0, 0]))
    cases["perfect"] = (np.linspace(2, 3, 8), np.linspace(-1, 0, 5), np.arange(8) % 3, np.arange(8) % 3)
    cases["all_wrong"] = (np.linspace(2, 3, 8), np.linspace(-1, 2.5, 5), np.ones(8, dtype=int), np.zeros(8, dtype=int))
    cases["reversed"] = (np.linspace(-1, 0, 6), np.linspace(2, 3, 5), np.zeros(6, dtype=int), np.zeros(6, dtype=int))
    # equally spaced corners: scikit-learn drops the middle point, which moves the first point reaching 90% TPR
    cases["collinear"] = (np.array([5.0, 4.0, 3.0]), np.array([4.5, 3.5, 2.5, 1.0, 0.5, 0.2, 0.1, 0.0, -1, -2]),
                          np.zeros(3, dtype=int), np.zeros(3, dtype=int))
    return cases


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("theta_from", ["val", "zero", "none"])
def test_every_column_equals_the_reference_formula(name, theta_from):
    id_conf, ood_conf, pred, labels = CASES[name]
    theta = {"val": float(np.median(np.r_[id_conf, ood_conf])) or 0.25, "zero": 0.0, "none": None}[theta_from]
    expect, got = ref_all(id_conf, ood_conf, pred, labels, theta), ours_all(id_conf, ood_conf, pred, labels, theta)
    assert list(got) == ["TNR@10", "TNR@20", "AUROC", "AUPR", "FPR", "ACC", "AUOSCR", "OpenAUC", "OSA", "OOSA"]
    for column, value in expect.items():
        if np.isnan(value):
            assert np.isnan(got[column]), (name, column)
        else:
            assert got[column] == pytest.approx(value, abs=1e-12), (name, column)


def test_known_answers():
    """By hand: ID conf [3, 2, 1] (predictions right, right, wrong), OOD conf [2.5, 0]."""
    known, unknown = np.array([3.0, 2.0, 1.0]), np.array([2.5, 0.0])
    pred, labels = np.array([0, 1, 1]), np.array([0, 1, 0])
    # OSA over thresholds {0, 1, 2, 2.5, 3}: 1/4, 1/2, 7/12, 5/12, 2/3 (at 3: 0.5 * 1/3 + 0.5 * 2/2)
    assert om.osa_threshold(known, unknown, pred, labels) == pytest.approx((2 / 3, 3.0))
    assert om.osa_at(known, unknown, pred, labels, 2.0) == pytest.approx(0.5 * 2 / 3 + 0.5 * 1 / 2)
    # OpenAUC: the wrong row ranks above every unknown; pairs (known right vs unknown) won: 3 of 4; total 3 / 6
    assert om.openauc(known, unknown, pred, labels) == pytest.approx(3 / 6)
    # OSCR cuts k = 0..3 in ascending conf (0 U, 1 K-wrong, 2 K, 2.5 U, 3 K): (FPR, CCR) = (1, 2/3), (1/2, 2/3),
    # (1/2, 1/3), (1/2, 1/3); with (0, 0) twice and (1, 1): area 1/2 * 2/3 + 1/2 * (1/3 + 0) / 2 = 5/12 (the cut above
    # every row, (0, 1/3), is never made: the curve falls to (0, 0) from FPR 1/2)
    assert om.auoscr(known, unknown, pred, labels) == pytest.approx(5 / 12)
    assert om.accuracy(pred, labels) == pytest.approx(2 / 3)


def test_collinear_case_is_the_scikit_learn_curve_not_the_exact_one():
    """The dropped ROC point changes TNR@10 (the reason the reference's FPR and TNR are recomputed here)."""
    from detectors.metrics import fpr_at_tpr

    id_conf, ood_conf = CASES["collinear"][:2]
    conf, label = _conf_label(id_conf, ood_conf, np.zeros(3, dtype=np.int64))
    assert om.tnr_at_fnr(id_conf, ood_conf, 0.1) == pytest.approx(ref_tnr(conf, label, 0.1))
    assert om.fpr_at_recall(id_conf, ood_conf) == pytest.approx(ref_auroc_aupr_fpr(conf, label)[2])
    assert om.fpr_at_recall(id_conf, ood_conf, 0.95) >= fpr_at_tpr(id_conf, ood_conf, 0.95, "ood")


def test_auoscr_never_exceeds_the_closed_set_accuracy():
    """A property over many random draws (sizes, tie levels, accuracy): AUOSCR <= ACC, and <= AUROC's bound 1."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        n_id, n_ood = int(rng.integers(1, 30)), int(rng.integers(1, 30))
        levels = int(rng.integers(1, 6))
        id_conf = rng.integers(0, levels, n_id) + rng.normal(0, rng.choice([0.0, 1.0]), n_id)
        ood_conf = rng.integers(0, levels, n_ood) + rng.normal(0, rng.choice([0.0, 1.0]), n_ood)
        labels = rng.integers(0, 3, n_id)
        pred = np.where(rng.random(n_id) < rng.random(), labels, rng.integers(0, 3, n_id))
        area = om.auoscr(id_conf, ood_conf, pred, labels)
        assert -1e-12 <= area <= om.accuracy(pred, labels) + 1e-12
        assert area == pytest.approx(ref_auoscr(id_conf, ood_conf, pred, labels), abs=1e-12)


def test_perfect_and_degenerate_values():
    id_conf, ood_conf, pred, labels = CASES["perfect"]
    got = om.reference_metrics(id_conf, ood_conf, om.Predictions(pred, labels), theta=1.0)
    # the reference's curve has no cut between the lowest known and the highest unknown row: its last segment runs
    # from (1/5, 1) to (0, 7/8), so perfect separation gives 4/5 + 1/5 * (1 + 7/8) / 2 = 0.9875, not 1
    assert got["auoscr"] == pytest.approx(0.9875) and got["openauc"] == pytest.approx(1.0)
    assert got["osa"] == pytest.approx(1.0) and got["oosa"] == pytest.approx(1.0)
    assert got["tnr10"] == got["tnr20"] == 1.0 and got["fpr95_ref"] == 0.0 and got["ap_out"] == pytest.approx(1.0)
    id_conf, ood_conf, pred, labels = CASES["all_wrong"]
    got = om.reference_metrics(id_conf, ood_conf, om.Predictions(pred, labels), theta=1.0)
    assert got["auoscr"] == 0.0 and got["openauc"] == 0.0
    id_conf, ood_conf, pred, labels = CASES["all_equal"]
    got = om.reference_metrics(id_conf, ood_conf, om.Predictions(pred, labels), theta=0.3)
    assert got["tnr10"] == 0.0 and got["fpr95_ref"] == 1.0 and got["ap_out"] == pytest.approx(0.4)


def test_missing_predictions_and_thresholds():
    id_conf, ood_conf, pred, labels = CASES["random0"]
    got = om.reference_metrics(id_conf, ood_conf)
    assert all(np.isnan(got[k]) for k in ("auoscr", "openauc", "osa", "oosa", "oosa_threshold"))
    assert not np.isnan(got["tnr10"])
    zero = om.reference_metrics(id_conf, ood_conf, om.Predictions(pred, labels), theta=0.0)
    assert np.isnan(zero["osa"]) and np.isnan(zero["oosa"]) and zero["oosa_threshold"] == 0.0  # `if theta:`
    fixed = om.reference_metrics(id_conf, ood_conf, om.Predictions(pred, labels), theta=0.0, zero_theta_missing=False)
    assert fixed["oosa"] == pytest.approx(ref_osa_at(id_conf, ood_conf, pred, labels, 0.0))
    with pytest.raises(ValueError, match="ood_conf is empty"):
        om.reference_metrics(id_conf, [])
    with pytest.raises(ValueError, match="predictions and"):
        om.reference_metrics(id_conf, ood_conf, om.Predictions(pred[:-1], labels[:-1]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_openauc_equals_xcurve(name):
    xcurve = pytest.importorskip("XCurve.Metrics", reason="xcurve not installed (see .ci/parity_deps)")
    id_conf, ood_conf, pred, labels = CASES[name]
    # the reference's call (metrics.py:136-138): score_known, score_unknown = -conf
    expect = xcurve.OpenAUC(-np.asarray(id_conf), -np.asarray(ood_conf), np.asarray(pred), np.asarray(labels))
    assert om.openauc(id_conf, ood_conf, pred, labels) == pytest.approx(expect, abs=1e-12)
