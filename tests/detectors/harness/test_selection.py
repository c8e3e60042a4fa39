"""detectors.select on cached features: the KNN k sweep picks the point a manual loop finds best; ties resolve as the
reference's search (a replica of its loop below), under the protocol's rule or `select.ties`."""
import math

import numpy as np
import pytest

import detectors
from detectors import FeatureSet
from detectors.harness.selection import grid, kept_index
from detectors.metrics import auroc, evaluate


def recursive_generator(lists):
    """OpenOOD's Evaluator.recursive_generator (openood/evaluation_api/evaluator.py), restated: the first list varies
    fastest."""
    if len(lists) == 1:
        return [[x] for x in lists[0]]
    return [y + [x] for x in lists[-1] for y in recursive_generator(lists[:-1])]


def reference_search(combinations, aurocs, initial=None):
    """Open-Insect's OODEvaluator.hyperparam_search (src/openood/evaluators/ood_evaluator.py:388-427), restated on
    given AUROCs: the maximum is noted with `>` from 0, then every point equal to it is set in turn; a search that
    sets nothing leaves the postprocessor's `initial` values."""
    aps, max_auroc, chosen = {}, 0, initial
    for combination, value in zip(combinations, aurocs):
        aps[combinations.index(combination)] = value
        if value > max_auroc:
            max_auroc = value
    for key in aps:
        if aps[key] == max_auroc:
            chosen = combinations[key]
    return chosen


def unified_search(combinations, aurocs):
    """OpenOOD's unified Evaluator.hyperparam_search (openood/evaluation_api/evaluator.py:401-422), restated: the
    index of the first point above the running maximum (from 0)."""
    final, max_auroc = None, 0
    for i, value in enumerate(aurocs):
        if value > max_auroc:
            final, max_auroc = i, value
    return combinations[final]


def scripted_select(monkeypatch, space, aurocs, **kwargs):
    """`detectors.select` over `space` (EBO; GEN for its two keys) with the validation AUROC of the i-th fitted point
    set to aurocs[i]."""
    import detectors.harness.selection as selection

    rng = np.random.default_rng(3)
    id_val, ood_val = FeatureSet(logits=rng.normal(1, 1, (20, 3))), FeatureSet(logits=rng.normal(0, 1, (20, 3)))
    calls = []

    def scripted(a, b):
        calls.append(1)
        return {**evaluate(a, b), "auroc": aurocs[len(calls) - 1]}

    monkeypatch.setattr(selection, "evaluate", scripted)
    return selection.select("gen" if "M" in space else "ebo", id_val, ood_val, space=space, **kwargs)


NAN = float("nan")
CURVES = {  # (grid, AUROC of each point in grid order)
    "tie of two": ({"temperature": [1, 2, 3, 4]}, [0.7, 0.9, 0.8, 0.9]),
    "ties and NaNs": ({"temperature": [1, 2, 3, 4, 5]}, [NAN, 0.6, NAN, 0.6, 0.5]),
    "one point": ({"temperature": [1]}, [0.55]),
    "all equal": ({"temperature": [1, 2, 3]}, [0.8, 0.8, 0.8]),
    "all zero": ({"temperature": [1, 2]}, [0.0, 0.0]),
    # two keys: the first varies fastest, so the tied points (0.5, 5) and (0.5, 7) are the 2nd and the 4th
    "two keys": ({"gamma": [0.1, 0.5], "M": [5, 7]}, [0.6, 0.9, 0.7, 0.9]),
}


@pytest.mark.parametrize("case", sorted(CURVES))
def test_ties_keep_what_the_reference_search_keeps(monkeypatch, case):
    space, aurocs = CURVES[case]
    combinations = recursive_generator(list(space.values()))
    _, params, table = scripted_select(monkeypatch, space, aurocs)
    assert [params[k] for k in space] == reference_search(combinations, aurocs)
    assert [row["chosen"] for row in table].count(True) == 1
    chosen = next(row for row in table if row["chosen"])
    assert [chosen[k] for k in space] == [params[k] for k in space]
    if not any(math.isnan(v) for v in aurocs) and max(aurocs) > 0:  # the unified evaluator crashes or agrees there
        _, first, _ = scripted_select(monkeypatch, space, aurocs, ties="first")
        assert [first[k] for k in space] == unified_search(combinations, aurocs)


def test_kept_index_rules():
    assert kept_index([0.7, 0.9, 0.8, 0.9]) == 3 and kept_index([0.7, 0.9, 0.8, 0.9], "first") == 1
    assert kept_index([NAN, 0.5, NAN]) == 1 == kept_index([NAN, 0.5, NAN], "first")  # a NaN never wins
    assert kept_index([NAN, NAN]) == 0  # every metric NaN: the first point (the reference keeps its config defaults)
    assert kept_index([-0.2, -0.1, -0.1]) == 2  # negated FPR@95: the largest value, the last of its ties
    with pytest.raises(ValueError, match="tie rule"):
        detectors.select("ebo", FeatureSet(logits=np.eye(3)), FeatureSet(logits=np.eye(3)), ties="middle")


def test_grid_is_the_cartesian_product_in_openoods_order():
    assert grid({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert grid({}) == [{}]
    space = {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028], "c": ["u", "v", "w"]}
    assert [list(p.values()) for p in grid(space)] == recursive_generator(list(space.values()))
    assert [tuple(p.values()) for p in grid(space)][:3] == [(1, 0.0014, "u"), (10, 0.0014, "u"), (100, 0.0014, "u")]


def test_a_real_tie_keeps_the_last_point_in_openoods_order():
    """GEN with M >= C classes scores every class alike, so its M points tie: the last in OpenOOD's order wins (the
    reference's search), the first with ties="first"."""
    rng = np.random.default_rng(0)
    id_val = FeatureSet(logits=rng.normal(0, 1, (40, 3)) + [4, 0, 0])
    ood_val = FeatureSet(logits=rng.normal(0, 1, (40, 3)))
    space = {"M": [5, 3], "gamma": [0.1]}
    _, params, table = detectors.select("gen", id_val, ood_val, space=space)
    assert table[0]["auroc"] == table[1]["auroc"]  # M >= C: the top-M entropy is the same
    assert params == {"M": 3, "gamma": 0.1} and [row["chosen"] for row in table] == [False, True]
    _, params, _ = detectors.select("gen", id_val, ood_val, space=space, ties="first")
    assert params == {"M": 5, "gamma": 0.1}
    space = {"gamma": [0.1, 0.5], "M": [5, 3]}
    _, params, table = detectors.select("gen", id_val, ood_val, space=space)
    order = [(row["gamma"], row["M"]) for row in table]
    assert order == [(0.1, 5), (0.5, 5), (0.1, 3), (0.5, 3)]  # the first key fastest
    combinations = [list(p) for p in order]
    assert [params["gamma"], params["M"]] == reference_search(combinations, [row["auroc"] for row in table])
    assert params["M"] == 3  # the tie across M: the later M of the best gamma


def test_a_nan_metric_never_wins(monkeypatch):
    import detectors.harness.selection as selection

    rng = np.random.default_rng(1)
    id_val, ood_val = FeatureSet(rng.normal(2, 1, (30, 4))), FeatureSet(rng.normal(0, 1, (30, 4)))
    real = selection.evaluate
    calls = []

    def first_is_nan(a, b):
        calls.append(1)
        return {**real(a, b), "auroc": float("nan")} if len(calls) == 1 else real(a, b)

    monkeypatch.setattr(selection, "evaluate", first_is_nan)
    _, params, table = selection.select("knn", id_val, ood_val, id_train=id_val, space={"k": [1, 2]}, ties="first")
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
    last_best = lambda values: max(i for i, v in enumerate(values) if v == max(values))  # noqa: E731 - ties: the last
    assert params == {"k": space["k"][last_best(manual)]}
    assert best.params["k"] == params["k"] and best.fitted
    assert len(set(manual)) > 1  # the sweep is not degenerate
    fpr_best, fpr_params, _ = detectors.select("knn", id_val, ood_val, id_train=train, space=space, metric="fpr95")
    assert fpr_params == {"k": space["k"][last_best([-f for f in fprs])]}  # FPR@95 minimised, ties: the last
    assert fprs.count(min(fprs)) > 1  # this data ties on FPR@95: the rule is exercised


def test_rule_selection_marks_the_best_per_method_in_the_metric_direction():
    from detectors.harness.evaluate import rule_selection

    rows = [{"base": "oe", "rule": "", "metric": "fpr95", "value": 0.4},
            {"base": "oe", "rule": "knn", "metric": "fpr95", "value": 0.2},
            {"base": "oe", "rule": "ebo", "metric": "fpr95", "value": 0.3},
            {"base": "udg", "rule": "", "metric": "auroc", "value": 0.7},
            {"base": "udg", "rule": "mds", "metric": "auroc", "value": 0.9}]
    table = rule_selection(rows)
    assert list(table["chosen"]) == [False, True, False, False, True]  # FPR lower is better, AUROC higher


@pytest.mark.slow
def test_runner_sweeps_by_default_with_ood_val_and_says_when_defaults_ran(digits, tmp_path, capsys):
    """With `ood_val` (no `select:`) the protocol's grids run, ODIN's on the validation images; rows say what chose.
    Without OOD validation one line says that defaults ran."""
    import json

    import pandas as pd

    from detectors.harness.evaluate import run_config
    from tests.detectors.harness.runner_helpers import eval_config

    _, ood_dir, _ = digits
    val = {"manifest": str(ood_dir), "split": "test", "sets": ["texture"]}
    config = eval_config(digits, tmp_path / "swept",
                         detectors=["odin", "ebo", {"name": "knn", "params": {"k": 5}}, "neco"],
                         ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}], ood_val=val, protocol="open-insects")
    results = run_config(config)
    rows = results.set_index("method")
    assert rows.loc["odin", "selected_on"] == "auroc: id_val vs ood_val[texture]"
    assert rows.loc["ebo", "selected_on"] == rows.loc["odin", "selected_on"]  # one point (T 1), recorded as APS does
    assert rows.loc["knn", "selected_on"] == ""  # k given: fixed, no sweep
    table = pd.read_csv(tmp_path / "swept" / "selection" / "odin.csv")
    assert list(zip(table["temperature"], table["noise"])) == [(t, n) for n in (0.0014, 0.0028)
                                                               for t in (1, 10, 100, 1000)]
    chosen = json.loads(rows.loc["odin", "params"])
    points = [[t, n] for t, n in zip(table["temperature"], table["noise"])]
    assert [chosen["temperature"], chosen["noise"]] == reference_search(points, list(table["auroc"]))
    assert table["chosen"].tolist().count(True) == 1
    assert table.loc[table["chosen"], ["temperature", "noise"]].values.tolist() == [[chosen["temperature"],
                                                                                     chosen["noise"]]]
    assert not (tmp_path / "swept" / "selection" / "knn.csv").exists()
    # NECO's open-insects dims (100 ... 400) exceed these 64-d features: recorded, and its defaults run
    assert rows.loc["neco", "selected_on"] == "defaults: no grid point fits the data"
    assert "no point of the search space" in pd.read_csv(tmp_path / "swept" / "selection" / "neco.csv")["error"][0]
    capsys.readouterr()
    run_config({**config, "out": str(tmp_path / "plain"), "ood_val": None})
    lines = [line for line in capsys.readouterr().out.splitlines() if "defaults ran" in line]
    assert lines == ["[oodforge] no OOD validation (`ood_val`): defaults ran where protocol open-insects sweeps (odin, "
                     "ebo, neco)"]


@pytest.mark.slow
def test_a_tied_sweep_through_evaluate_keeps_the_reference_point_and_marks_it(digits, tmp_path, capsys):
    """scripts/evaluate.py, protocol open-insects: GEN's M points all tie on six classes (top-M with M >= C is every
    class), so the reference's search keeps M 1000, the last of gen.yml's M list; `select.ties=first` keeps M 10. The
    sweep table marks the kept row, the results row records its parameters, and the rule is in the unit's key."""
    import json

    import pandas as pd
    import yaml

    from tests.detectors.harness.runner_helpers import eval_config, evaluate_main

    _, ood_dir, _ = digits
    config = eval_config(digits, tmp_path / "run", detectors=["gen"], protocol="open-insects",
                         ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                         ood_val={"manifest": str(ood_dir), "split": "test", "sets": ["texture"]})
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    main = evaluate_main().main
    picks, keys = {}, {}
    for ties in ("protocol", "first"):
        out = tmp_path / ties
        assert main(["--config", str(path), "--out", str(out),
                     *([] if ties == "protocol" else [f"select.ties={ties}"])]) == 0
        table = pd.read_csv(out / "selection" / "gen.csv")
        assert len(table) == 7 * 6 and table["chosen"].sum() == 1
        points = [[g, m] for g, m in zip(table["gamma"], table["M"])]
        assert points == recursive_generator([[0.01, 0.1, 0.5, 1, 2, 5, 10], [10, 50, 100, 200, 500, 1000]])
        kept = table.loc[table["chosen"], ["gamma", "M"]].values.tolist()[0]
        assert table.groupby("gamma")["auroc"].nunique().eq(1).all()  # every gamma's M points tie
        search = reference_search if ties == "protocol" else unified_search
        assert kept == search(points, list(table["auroc"]))
        params = json.loads(pd.read_csv(out / "results.csv")["params"][0])
        assert [params["gamma"], params["M"]] == kept
        picks[ties] = kept
        keys[ties] = json.loads(next((out / "units").rglob("unit.json")).read_text())["key"]
    assert picks["protocol"][1] == 1000 and picks["first"][1] == 10
    assert keys["protocol"] != keys["first"]
    capsys.readouterr()
