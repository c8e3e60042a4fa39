"""detectors.select on cached features: the KNN k sweep picks the point a manual loop finds best."""
import numpy as np

import detectors
from detectors import FeatureSet
from detectors.metrics import auroc, evaluate
from detectors.selection import grid


def test_grid_is_the_cartesian_product():
    assert grid({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert grid({}) == [{}]


def test_knn_k_sweep_matches_manual_loop():
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, (3, 8)) * 3
    train = FeatureSet(centres[rng.integers(0, 3, 300)] + rng.normal(size=(300, 8)))
    id_val = FeatureSet(centres[rng.integers(0, 3, 60)] + rng.normal(size=(60, 8)))
    ood_val = FeatureSet(rng.normal(0, 3, (60, 8)))
    space = {"k": [1, 5, 20, 100, 250]}
    best, params, table = detectors.select("knn", id_val, ood_val, id_train=train, space=space)
    manual, fprs = [], []
    for k in space["k"]:
        det = detectors.build("knn", k=k).fit(train)
        metrics = evaluate(det.score(id_val), det.score(ood_val))
        manual.append(auroc(det.score(id_val), det.score(ood_val)))
        fprs.append(metrics["fpr95"])
    assert [row["auroc"] for row in table] == manual
    assert params == {"k": space["k"][int(np.argmax(manual))]}
    assert best.k == params["k"] and best.fitted
    assert len(set(manual)) > 1  # the sweep is not degenerate
    fpr_best, fpr_params, _ = detectors.select("knn", id_val, ood_val, id_train=train, space=space, metric="fpr95")
    assert fpr_params == {"k": space["k"][int(np.argmin(fprs))]}


def test_rule_selection_marks_the_best_per_method_in_the_metric_direction():
    from detectors.evaluate import rule_selection

    rows = [{"base": "oe", "rule": "", "metric": "fpr95", "value": 0.4},
            {"base": "oe", "rule": "knn", "metric": "fpr95", "value": 0.2},
            {"base": "oe", "rule": "ebo", "metric": "fpr95", "value": 0.3},
            {"base": "udg", "rule": "", "metric": "auroc", "value": 0.7},
            {"base": "udg", "rule": "mds", "metric": "auroc", "value": 0.9}]
    table = rule_selection(rows)
    assert list(table["chosen"]) == [False, True, False, False, True]  # FPR lower is better, AUROC higher
