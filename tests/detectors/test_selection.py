"""detectors.select on cached features: the KNN k sweep picks the point a manual loop finds best."""
import numpy as np

import detectors
from detectors import FeatureSet
from detectors.metrics import auroc, evaluate
from detectors.selection import grid


def recursive_generator(lists):
    """OpenOOD's Evaluator.recursive_generator (openood/evaluation_api/evaluator.py), restated: the first list varies
    fastest."""
    if len(lists) == 1:
        return [[x] for x in lists[0]]
    return [y + [x] for x in lists[-1] for y in recursive_generator(lists[:-1])]


def test_grid_is_the_cartesian_product_in_openoods_order():
    assert grid({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert grid({}) == [{}]
    space = {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028], "c": ["u", "v", "w"]}
    assert [list(p.values()) for p in grid(space)] == recursive_generator(list(space.values()))
    assert [tuple(p.values()) for p in grid(space)][:3] == [(1, 0.0014, "u"), (10, 0.0014, "u"), (100, 0.0014, "u")]


def test_a_tie_keeps_the_first_point_in_openoods_order():
    """GEN with M >= C classes scores every class alike, so its M points tie: the first in OpenOOD's order wins."""
    rng = np.random.default_rng(0)
    id_val = FeatureSet(logits=rng.normal(0, 1, (40, 3)) + [4, 0, 0])
    ood_val = FeatureSet(logits=rng.normal(0, 1, (40, 3)))
    space = {"M": [5, 3], "gamma": [0.1]}
    _, params, table = detectors.select("gen", id_val, ood_val, space=space)
    assert table[0]["auroc"] == table[1]["auroc"]  # M >= C: the top-M entropy is the same
    assert params == {"M": 5, "gamma": 0.1}  # the first point wins the tie (OpenOOD: `auroc > max_auroc`)
    space = {"gamma": [0.1, 0.5], "M": [5, 3]}
    _, params, table = detectors.select("gen", id_val, ood_val, space=space)
    order = [(row["gamma"], row["M"]) for row in table]
    assert order == [(0.1, 5), (0.5, 5), (0.1, 3), (0.5, 3)]  # the first key fastest
    best = max(row["auroc"] for row in table)
    assert (params["gamma"], params["M"]) == next(p for p, row in zip(order, table) if row["auroc"] == best)


def test_a_nan_metric_never_wins(monkeypatch):
    import detectors.selection as selection

    rng = np.random.default_rng(1)
    id_val, ood_val = FeatureSet(rng.normal(2, 1, (30, 4))), FeatureSet(rng.normal(0, 1, (30, 4)))
    real = selection.evaluate
    calls = []

    def first_is_nan(a, b):
        calls.append(1)
        return {**real(a, b), "auroc": float("nan")} if len(calls) == 1 else real(a, b)

    monkeypatch.setattr(selection, "evaluate", first_is_nan)
    _, params, table = selection.select("knn", id_val, ood_val, id_train=id_val, space={"k": [1, 2]})
    assert np.isnan(table[0]["auroc"]) and params == {"k": 2}


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


def test_runner_sweeps_by_default_with_ood_val_and_says_when_defaults_ran(digits, tmp_path, capsys):
    """With `ood_val` (no `select:`) the protocol's grids run, ODIN's on the validation images; rows say what chose.
    Without OOD validation one line says that defaults ran."""
    import json

    import pandas as pd

    from detectors.evaluate import run_config
    from tests.detectors.runner_helpers import eval_config

    _, ood_dir, _ = digits
    val = {"manifest": str(ood_dir), "split": "test", "sets": ["texture"]}
    config = eval_config(digits, tmp_path / "swept", detectors=["odin", "ebo", {"name": "knn", "params": {"k": 5}}, "neco"],
                         ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}], ood_val=val, protocol="open-insects")
    results = run_config(config)
    rows = results.set_index("method")
    assert rows.loc["odin", "selected_on"] == "auroc: id_val vs ood_val[texture]"
    assert rows.loc["ebo", "selected_on"] == rows.loc["odin", "selected_on"]  # one point (T 1), recorded as APS does
    assert rows.loc["knn", "selected_on"] == ""  # k given: fixed, no sweep
    table = pd.read_csv(tmp_path / "swept" / "selection" / "odin.csv")
    assert list(zip(table["temperature"], table["noise"])) == [(t, n) for n in (0.0014, 0.0028) for t in (1, 10, 100, 1000)]
    chosen = json.loads(rows.loc["odin", "params"])
    best = table.loc[table["auroc"].idxmax()]  # idxmax: the first maximum, as OpenOOD's
    assert (chosen["temperature"], chosen["noise"]) == (best["temperature"], best["noise"])
    assert not (tmp_path / "swept" / "selection" / "knn.csv").exists()
    # NECO's open-insects dims (100 ... 400) exceed these 64-d features: recorded, and its defaults run
    assert rows.loc["neco", "selected_on"] == "defaults: no grid point fits the data"
    assert "no point of the search space" in pd.read_csv(tmp_path / "swept" / "selection" / "neco.csv")["error"][0]
    capsys.readouterr()
    run_config({**config, "out": str(tmp_path / "plain"), "ood_val": None})
    lines = [line for line in capsys.readouterr().out.splitlines() if "defaults ran" in line]
    assert lines == ["[oodforge] no OOD validation (`ood_val`): defaults ran where protocol open-insects sweeps (odin, ebo, neco)"]
