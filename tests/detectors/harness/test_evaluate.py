"""The evaluation runner end to end on the embedded digits data with a tiny transformers classifier."""
import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from runner_helpers import eval_config, run_cache

from detectors import build
from detectors.base import FeatureSet, LinearHead
from detectors.harness.evaluate import EvalConfig, Runner, run_config
from detectors.metrics import evaluate, precision_recall_at, threshold_at_tpr
from pipelines.classifier import ImageClassifier
from pipelines.data import read_manifest, write_manifest
from pipelines.features import extract_features
from pipelines.toydata import write_digits


def _config(digits, out, **extra):
    return eval_config(digits, out, **extra)


@pytest.mark.slow
def test_runner_matches_direct_computation(digits, tmp_path):
    results = run_config(_config(digits, tmp_path / "run", detectors=["msp", {"name": "knn", "params": {"k": 5}}],
                                 threshold_transfer=[{"source": "digits_6_9", "tpr": 0.95, "targets": ["sketch"]}]))
    assert set(results["method"]) == {"msp", "knn"}
    assert set(results["ood_set"]) == {"digits_6_9", "sketch", "texture"}
    assert dict(zip(results["ood_set"], results["group"])) == {"digits_6_9": "near", "sketch": "near", "texture": "far"}
    msp_near = results[(results.method == "msp") & (results.ood_set == "digits_6_9")].iloc[0]
    assert msp_near["auroc"] > 0.7  # digits 6-9 are a semantic shift a trained classifier sees

    # independent: extract features ourselves and score with the detectors directly
    id_dir, ood_dir, model = digits
    clf = ImageClassifier.from_pretrained(model)
    idm, oodm = read_manifest(id_dir), read_manifest(ood_dir)
    test = extract_features(clf, idm.select(split="test", role="id")).to_featureset()
    train = extract_features(clf, idm.select(split="train", role="id"))
    knn = build("knn", k=5).fit(train.to_featureset(), head=train.head())
    for name, det in (("msp", build("msp").fit(train.to_featureset())), ("knn", knn)):
        for ood_set in ("digits_6_9", "texture"):
            ood = extract_features(clf, oodm.select(split="test", ood_set=ood_set)).to_featureset()
            expect = evaluate(det.score(test), det.score(ood))
            got = results[(results.method == name) & (results.ood_set == ood_set)].iloc[0]
            for key, value in expect.items():
                assert got[key] == pytest.approx(value, abs=1e-6), (name, ood_set, key)

    scores = pd.read_parquet(tmp_path / "run" / "scores.parquet")
    assert set(scores.columns) >= {"method", "family", "role", "ood_set", "group", "index", "score"}
    assert (scores[(scores.method == "msp") & (scores.role == "id")].shape[0]) == len(test)

    transfer = pd.read_csv(tmp_path / "run" / "threshold_transfer.csv")
    msp_scores = scores[scores.method == "msp"]
    source = msp_scores[msp_scores.ood_set == "digits_6_9"]["score"].to_numpy()
    threshold = threshold_at_tpr(source, 0.95, "ood")
    expect = precision_recall_at(threshold, msp_scores[msp_scores.role == "id"]["score"],
                                 msp_scores[msp_scores.ood_set == "sketch"]["score"])
    row = transfer[transfer.method == "msp"].iloc[0]
    assert row["precision"] == pytest.approx(expect["precision"]) and row["recall"] == pytest.approx(expect["recall"])
    assert (source < threshold).mean() >= 0.95


def test_yaml_config_errors(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"id": "x", "ood": ["o"], "out": "o", "detetcors": "all"}))
    with pytest.raises(ValueError, match=r"bad.yaml: detetcors: unknown key \(did you mean 'detectors'\?\)"):
        EvalConfig.from_yaml(path)
    path.write_text(yaml.safe_dump({"ood": ["o"], "out": "o"}))
    with pytest.raises(ValueError, match="id: required"):
        EvalConfig.from_yaml(path)
    with pytest.raises(ValueError, match=r"detectors\[0\].name: unknown detector 'no_such_method'"):
        Runner(EvalConfig.from_dict({"id": "x", "ood": ["o"], "out": "o", "detectors": ["no_such_method"]}))


@pytest.mark.slow
def test_selection_through_runner(digits, tmp_path):
    """select.ood_val honours `sets` (texture for validation, digits 6-9 for test) and never reads test OOD rows."""
    id_dir, ood_dir, _ = digits
    results = run_config(_config(digits, tmp_path / "sel", detectors=["knn"],
                                 ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                                 select={"ood_val": {"manifest": str(ood_dir), "split": "test", "sets": ["texture"]},
                                         "metric": "auroc"}))
    table = pd.read_csv(tmp_path / "sel" / "selection" / "knn.csv")
    assert len(table) == len(build("knn").search_space["k"])
    assert set(table["ood_val"]) == {"texture"} and set(table["metric"]) == {"auroc"}  # which split chose
    fitted = table[table["auroc"].notna()]
    assert (fitted["k"] <= 430).all() and (table[table["auroc"].isna()]["k"] > 430).all()  # 430 ID train images
    assert len(results) == 1
    # the selected k is the best on the validation set (texture), computed independently
    clf = ImageClassifier.from_pretrained(digits[2])
    idm, oodm = read_manifest(id_dir), read_manifest(ood_dir)
    train = extract_features(clf, idm.select(split="train", role="id"))
    val = extract_features(clf, idm.select(split="val", role="id")).to_featureset()
    texture = extract_features(clf, oodm.select(ood_set="texture")).to_featureset()
    best_k, best = None, -1.0
    for k in table["k"]:
        if k > 430:
            continue
        auroc = evaluate(build("knn", k=int(k)).fit(train.to_featureset(), head=train.head()).score(val),
                         build("knn", k=int(k)).fit(train.to_featureset(), head=train.head()).score(texture))["auroc"]
        if auroc > best:
            best_k, best = k, auroc
    assert table.loc[table["auroc"].idxmax(), "k"] == best_k


def test_selection_refuses_test_rows(digits, tmp_path):
    _, ood_dir, _ = digits
    with pytest.raises(ValueError, match=r"select.ood_val: \d+ row\(s\) are test OOD rows"):
        Runner(EvalConfig.from_dict(_config(digits, tmp_path / "leak", detectors=["knn"],
                                            select={"ood_val": {"manifest": str(ood_dir), "split": "test"}})))
    assert not (tmp_path / "leak").exists()  # refused in the plan: nothing written


@pytest.mark.slow
def test_fewshot_sweep_through_runner(tmp_path):
    from pipelines.tiny import save_tiny_clip

    id_dir, ood_dir = write_digits(tmp_path / "data", n_textures=8)
    clip = save_tiny_clip(tmp_path / "clip")
    results = run_config({"id": str(id_dir), "ood": [{"manifest": str(ood_dir), "sets": ["texture", "sketch"]}],
                          "out": str(tmp_path / "out"), "detectors": [{"name": "mcm", "params": {"model": str(clip)}}],
                          "fewshot": {"model": str(clip), "methods": {"locoop": {"epochs": 1}}, "shots": [1, 2],
                                      "seeds": [0, 1]}})
    assert list(results["method"]) == ["mcm", "mcm"]
    rows = pd.read_csv(tmp_path / "out" / "fewshot.csv")
    assert len(rows) == 1 * 2 * 2 * 2  # methods x shots x seeds x OOD sets
    assert set(rows["group"]) == {"far", "near"} and rows["auroc"].between(0, 100).all()
    assert (tmp_path / "out" / "fewshot.png").stat().st_size > 0
    assert (tmp_path / "out" / "fewshot" / "locoop-2shot-seed1" / "model.safetensors").is_file()


@pytest.mark.slow
def test_level_head_of_a_multi_granularity_classifier(digits, tmp_path):
    """`head: {levels, level}` scores with that level's head and takes ID labels from its field."""
    from pipelines.training import MultiGranularity

    id_dir, ood_dir, model = digits
    clf = ImageClassifier.from_pretrained(model)
    levels = MultiGranularity({"parity": "parity"})
    idm = read_manifest(id_dir)
    levels.fit_targets({"parity": ["even", "odd"]})
    torch.manual_seed(1)
    levels.setup(clf.head.in_features, clf.num_classes)
    levels.save_pretrained(tmp_path / "levels")
    rows = [{**r, "parity": "even" if r["label"] % 2 == 0 else "odd"} for r in idm.rows]
    parity_dir = tmp_path / "parity_id"  # the same images (manifest_info.json points at them), plus a parity field
    write_manifest(parity_dir, rows)
    (parity_dir / "manifest_info.json").write_text(json.dumps({"image_root": str(id_dir)}))
    results = run_config(_config(digits, tmp_path / "run", id=str(parity_dir), detectors=["msp", "mds"],
                                 ood=[{"manifest": str(ood_dir), "sets": ["texture"]}],
                                 head={"levels": str(tmp_path / "levels"), "level": "parity"}))

    head = LinearHead(*levels.level_head("parity"))
    pm = read_manifest(parity_dir)
    sets = {}
    for name, manifest in (("train", pm.select(split="train")), ("test", pm.select(split="test")),
                           ("texture", read_manifest(ood_dir).select(ood_set="texture"))):
        cache = extract_features(clf, manifest)
        labels = np.array([0 if manifest.rows[i].get("parity") == "even" else 1 for i in cache.index])
        sets[name] = FeatureSet(cache.features, head(cache.features.astype(np.float64)), labels)
    for name in ("msp", "mds"):
        det = build(name).fit(sets["train"], head=head)
        expect = evaluate(det.score(sets["test"]), det.score(sets["texture"]))
        got = results[results.method == name].iloc[0]
        assert got["auroc"] == pytest.approx(expect["auroc"], abs=1e-6)
        assert got["fpr95"] == pytest.approx(expect["fpr95"], abs=1e-6)


@pytest.mark.slow
def test_two_processes_give_the_one_process_results(digits, tmp_path):
    """`torchrun ... -m oodforge evaluate` with 2 CPU processes: features and ODIN's images are split across processes
    and gathered, detectors whose statistics are sums fit per-process shards reduced over the processes; the table is
    one process's."""
    import subprocess
    import sys
    from pathlib import Path

    config = _config(digits, tmp_path / "two", detectors=["msp", "knn", "odin", "mds", "rmds", "vim", "react", "she"],
                     ood=[{"manifest": str(digits[1]), "sets": ["texture"]}])
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "oodforge", "evaluate",
                           "--config", str(path)],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-3000:]
    two = pd.read_csv(tmp_path / "two" / "results.csv")
    one = run_config({**config, "out": str(tmp_path / "one")})
    columns = ["auroc", "fpr95", "fpr95_id", "aupr_in", "aupr_out", "n_id", "n_ood"]
    pd.testing.assert_frame_equal(two[["method", "ood_set", *columns]], one[["method", "ood_set", *columns]],
                                  check_exact=False, atol=1e-6)


@pytest.mark.slow
def test_level_head_stays_with_aux_and_select(digits, single_torch_thread, tmp_path):
    """With `aux:` and `select:` set, validation and auxiliary features are scored by the level head too.

    The oracle scores the run's own feature caches (the extraction is checked in tests/pipelines/test_features.py) with
    the level head, its logits rounded to float32 as the runner stores them (`detectors.harness.prepare._level_head`),
    on one torch thread: the inputs and arithmetic of the run bit for bit, so the exact comparisons hold on any machine
    and load.
    OE keeps its last epoch: the best-epoch choice compares two ID-val accuracies that this tiny head leaves within
    one image of each other, so float rounding of one thread count against another picked a different epoch.
    The issue-41 failure (trained-head scores 0.004 apart in a full suite, passing alone) came from an oracle that
    re-extracted the features and kept float64 logits: inputs equal only up to float32 rounding and to the kernels'
    batch-size and thread choices, which flip near-tied AUROC pairs and which two epochs of OE training amplify."""
    from detectors.harness.plan import make_plan
    from pipelines.training import MultiGranularity

    id_dir, ood_dir, model = digits
    clf = ImageClassifier.from_pretrained(model)
    levels = MultiGranularity({"parity": "parity"})
    levels.fit_targets({"parity": ["even", "odd"]})
    torch.manual_seed(2)
    levels.setup(clf.head.in_features, clf.num_classes)
    levels.save_pretrained(tmp_path / "levels")
    idm = read_manifest(id_dir)
    parity_dir = tmp_path / "parity_id"
    write_manifest(parity_dir, [{**r, "parity": "even" if r["label"] % 2 == 0 else "odd"} for r in idm.rows])
    (parity_dir / "manifest_info.json").write_text(json.dumps({"image_root": str(id_dir)}))
    out = tmp_path / "run"
    plan = make_plan(_config(digits, out, id=str(parity_dir),
                             detectors=["ebo", {"name": "oe", "params": {"epochs": 2, "mode": "heads",
                                                                          "checkpoint": "last"}}],
                             ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                             aux={"manifest": str(ood_dir), "split": "test", "sets": ["sketch"]},
                             select={"ood_val": {"manifest": str(ood_dir), "split": "test", "sets": ["texture"]}},
                             head={"levels": str(tmp_path / "levels"), "level": "parity"}))
    run_config(plan)

    head = LinearHead(*levels.level_head("parity"))
    splits = {(s.role, s.name): s for s in plan.splits}

    def level_set(role, name):
        cache, split = run_cache(plan, role, name)
        rows = [split.manifest.rows[i] for i in cache.index]
        lab = np.array([-1 if r["role"] == "ood" else 0 if r.get("parity") == "even" else 1 for r in rows])
        return FeatureSet(cache.features, head(cache.features.astype(np.float64)).astype(np.float32), lab)

    names = {role: [name for r, name in splits if r == role] for role, _ in splits}
    assert sorted(names["id"]) == ["id_test", "id_train", "id_val"] and names["aux"] and names["ood_val"]
    val, texture = level_set("id", "id_val"), level_set("ood_val", names["ood_val"][0])
    table = pd.read_csv(out / "selection" / "ebo.csv")
    assert len(table) >= 1
    for _, row in table.iterrows():
        det = build("ebo", temperature=row["temperature"]).fit(val)
        assert row["auroc"] == pytest.approx(evaluate(det.score(val), det.score(texture))["auroc"], abs=1e-9)

    aux = level_set("aux", names["aux"][0])
    train, test, near = level_set("id", "id_train"), level_set("id", "id_test"), level_set("ood", "digits_6_9")
    oe = build("oe", mode="heads", epochs=2, checkpoint="last").fit(train, head=head, id_val=val, aux=aux)
    got = pd.read_parquet(out / "scores.parquet")
    got = got[got.method == "oe"]
    np.testing.assert_allclose(got[got.role == "id"]["score"], oe.score(test), atol=1e-6)
    np.testing.assert_allclose(got[got.role == "ood"]["score"], oe.score(near), atol=1e-6)


@pytest.mark.slow
def test_post_hoc_rules_rescore_a_trained_model(digits, single_torch_thread, tmp_path):
    """`rules:` fit each post-hoc rule on the trained model's outputs (transform, trained_head); same as by hand, on
    the run's own feature caches and one torch thread (`run_cache`: exact on any machine and load)."""
    from detectors.harness.plan import make_plan

    id_dir, ood_dir, model = digits
    plan = make_plan(_config(digits, tmp_path / "run", ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                             detectors=[{"name": "logitnorm", "params": {"epochs": 2, "mode": "heads"},
                                         "rules": ["ebo", "knn"]}]))
    results = run_config(plan)
    assert list(results["method"]) == ["logitnorm", "logitnorm+ebo", "logitnorm+knn"]
    assert list(results["base"]) == ["logitnorm"] * 3 and list(results["rule"]) == ["", "ebo", "knn"]
    train = run_cache(plan, "id", "id_train")[0]
    val, test = (run_cache(plan, "id", name)[0].to_featureset() for name in ("id_val", "id_test"))
    near = run_cache(plan, "ood", "digits_6_9")[0].to_featureset()
    trained = build("logitnorm", mode="heads", epochs=2).fit(train.to_featureset(), head=train.head(), id_val=val)
    for rule in ("ebo", "knn"):
        post = build(rule).fit(trained.transform(train.to_featureset()), head=trained.trained_head,
                               id_val=trained.transform(val))
        expect = evaluate(post.score(trained.transform(test)), post.score(trained.transform(near)))
        got = results[results.method == f"logitnorm+{rule}"].iloc[0]
        assert (got["auroc"] == pytest.approx(expect["auroc"], abs=1e-9)
                and got["fpr95"] == pytest.approx(expect["fpr95"], abs=1e-9))


@pytest.mark.slow
def test_rule_rows_accuracy_and_rule_selection_on_validation(digits, single_torch_thread, tmp_path):
    """Re-scored rows are family `training` with base/rule; each row's id_acc is the accuracy of the classifier it
    scores with; rule_selection.csv holds each rule's value on (ID val, OOD val) and marks the best; scores carry file
    names. The oracle trains on the run's own feature caches, on one torch thread (`run_cache`)."""
    from detectors.harness.plan import make_plan

    id_dir, ood_dir, model = digits
    out = tmp_path / "run"
    plan = make_plan(_config(digits, out, ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                             ood_val={"manifest": str(ood_dir), "split": "test", "sets": ["texture"]},
                             detectors=["msp", {"name": "logitnorm", "params": {"epochs": 2, "mode": "heads"},
                                                "rules": ["ebo", "knn"]}]))
    results = run_config(plan)
    rows = results.set_index("method")
    assert list(rows["family"]) == ["posthoc", "training", "training", "training"]
    assert (list(rows["base"]) == ["", "logitnorm", "logitnorm", "logitnorm"]
            and list(rows["rule"]) == ["", "", "ebo", "knn"])
    assert json.loads(rows.loc["logitnorm+knn", "params"])["k"] == build("knn").params["k"]
    assert json.loads(rows.loc["logitnorm", "params"])["epochs"] == 2
    assert list(rows["mode"]) == ["", "heads", "heads", "heads"]
    assert set(rows["protocol"]) == {"openood_v1.5"}  # every row names the protocol it ran under

    idm = read_manifest(id_dir)
    [ood_val] = [s.name for s in plan.splits if s.role == "ood_val"]
    feats = {name: run_cache(plan, role, split)[0].to_featureset() for name, role, split in (
        ("train", "id", "id_train"), ("val", "id", "id_val"), ("test", "id", "id_test"),
        ("texture", "ood_val", ood_val))}
    head = run_cache(plan, "id", "id_train")[0].head()
    accuracy = lambda fs: float((fs.logits.argmax(1) == fs.labels).mean())  # noqa: E731
    assert rows.loc["msp", "id_acc"] == pytest.approx(accuracy(feats["test"]))
    trained = build("logitnorm", mode="heads", epochs=2).fit(feats["train"], head=head, id_val=feats["val"])
    for method in ("logitnorm", "logitnorm+ebo", "logitnorm+knn"):
        assert rows.loc[method, "id_acc"] == pytest.approx(accuracy(trained.transform(feats["test"])), abs=1e-9)

    table = pd.read_csv(out / "rule_selection.csv", keep_default_na=False)
    view = {k: trained.transform(v) for k, v in feats.items()}
    expect = {"": evaluate(trained.score(feats["val"]), trained.score(feats["texture"]))["auroc"]}
    for rule in ("ebo", "knn"):
        post = build(rule).fit(view["train"], head=trained.trained_head, id_val=view["val"])
        expect[rule] = evaluate(post.score(view["val"]), post.score(view["texture"]))["auroc"]
    assert list(table["rule"]) == ["", "ebo", "knn"] and set(table["base"]) == {"logitnorm"}
    assert set(table["metric"]) == {"auroc"} and set(table["ood_val"]) == {"texture"}
    np.testing.assert_allclose(table["value"], [expect[r] for r in table["rule"]], atol=1e-9)
    assert list(table["chosen"]) == [r == max(expect, key=expect.get) for r in table["rule"]]

    scores = pd.read_parquet(out / "scores.parquet")
    test_rows = idm.select(split="test", role="id").rows
    ids = scores[(scores.method == "msp") & (scores.role == "id")]
    assert list(ids["file_name"]) == [test_rows[i]["file_name"] for i in ids["index"]]
    assert set(ids["manifest"]) == {str(id_dir)} and set(scores[scores.role == "ood"]["manifest"]) == {str(ood_dir)}


def test_an_ood_set_with_no_loadable_image_is_recorded_and_the_others_scored(digits, tmp_path, capsys):
    """One OOD set whose images are all missing: the plan warns, the run records it in failures.json (`sets`) and
    leaves it out, and every detector still scores the valid sets (never "ood_scores is empty")."""
    from detectors.harness.plan import make_plan
    from pipelines.data import make_row

    ghost = tmp_path / "ghost"
    ghost.mkdir()
    write_manifest(ghost,
                   [make_row(f"g{i}.png", split="test", role="ood", ood_set="ghost", group="far") for i in range(3)])
    config = _config(digits, tmp_path / "run", detectors=["msp", "knn"],
                     ood=[{"manifest": str(digits[1]), "sets": ["texture"]}, {"manifest": str(ghost)}])
    plan = make_plan(config)
    assert plan.warnings and "ood[1]: none of the 3 image file(s) of set 'ghost' exists" in plan.warnings[0]
    results = run_config(plan)
    assert set(results["method"]) == {"msp", "knn"} and set(results["ood_set"]) == {"texture"}
    failures = json.loads((tmp_path / "run" / "failures.json").read_text())
    assert [(f["split"], f["config"]) for f in failures["sets"]] == [("ghost", "ood[1]")]
    assert {f["file"] for f in failures["images"]} == {"g0.png", "g1.png", "g2.png"} and not failures["detectors"]
    assert "ood[1] set 'ghost'" in capsys.readouterr().err  # a warning: stderr
