"""The open-set columns of an evaluate run's results.csv (detectors.harness.openset): the predictions of the classifier
each row scores with, the OOSA threshold chosen on ID val against OOD val, every column as the reference formulas
(detectors.openset_metrics, itself checked in tests/detectors/test_openset_metrics.py) give them by hand."""
import json

import numpy as np
import pandas as pd
import pytest
from runner_helpers import eval_config

from detectors import build
from detectors.harness.evaluate import run_config
from detectors.harness.openset import (
    OOD_METRICS_FILE,
    KnownClasses,
    from_logits,
    ood_csv_table,
    oosa_threshold,
    openset_columns,
)
from detectors.harness.results import RESULT_COLUMNS
from detectors.openset_metrics import OOD_CSV_COLUMNS, OPENSET_METRICS, Predictions, osa_threshold, reference_metrics
from pipelines.classifier import ImageClassifier
from pipelines.data import read_manifest
from pipelines.features import extract_features


def _features(digits):
    id_dir, ood_dir, model = digits
    clf = ImageClassifier.from_pretrained(model)
    idm, oodm = read_manifest(id_dir), read_manifest(ood_dir)
    train = extract_features(clf, idm.select(split="train", role="id"))
    feats = {name: extract_features(clf, m).to_featureset() for name, m in (
        ("val", idm.select(split="val", role="id")), ("test", idm.select(split="test", role="id")),
        ("digits_6_9", oodm.select(ood_set="digits_6_9")), ("texture", oodm.select(ood_set="texture")))}
    return train, feats


def _assert_row(row, expect):
    for column in OPENSET_METRICS:
        if np.isnan(expect[column]):
            assert np.isnan(row[column]), column
        else:
            assert row[column] == pytest.approx(expect[column], abs=1e-9), column


@pytest.mark.slow
def test_results_rows_carry_the_reference_columns(digits, tmp_path):
    """Post-hoc rows use the run classifier's predictions, a training method's rows (its own and a rule's) the trained
    model's; OOSA's threshold comes from ID val against OOD val (texture) with the row's own scores."""
    _, ood_dir, _ = digits
    out = tmp_path / "run"
    results = run_config(eval_config(digits, out, ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                                     ood_val={"manifest": str(ood_dir), "split": "test", "sets": ["texture"]},
                                     detectors=["msp", {"name": "logitnorm", "params": {"epochs": 2, "mode": "heads"},
                                                        "rules": ["ebo"]}]))
    table = pd.read_csv(out / "results.csv")
    assert list(table.columns) == list(RESULT_COLUMNS)
    assert set(OOD_CSV_COLUMNS.values()) <= set(table.columns)
    ood_csv = pd.read_csv(out / OOD_METRICS_FILE)  # the reference's ood.csv shape beside results.csv
    assert list(ood_csv.columns) == ["method", "ood_set", *OOD_CSV_COLUMNS]
    pd.testing.assert_frame_equal(ood_csv, ood_csv_table(table), check_dtype=False)
    rows = results.set_index("method")

    train, feats = _features(digits)
    msp = build("msp").fit(train.to_featureset())
    trained = build("logitnorm", mode="heads", epochs=2).fit(train.to_featureset(), head=train.head(),
                                                             id_val=feats["val"])
    view = {k: trained.transform(v) for k, v in feats.items()}
    ebo = build("ebo").fit(trained.transform(train.to_featureset()), head=trained.trained_head, id_val=view["val"])
    # (score rule, its input, the classifier whose argmax gives the known-class predictions)
    cases = {"msp": (msp.score, feats, feats), "logitnorm": (trained.score, feats, view),
             "logitnorm+ebo": (ebo.score, view, view)}
    for method, (score, data, classifier) in cases.items():
        test = Predictions(classifier["test"].logits.argmax(1), classifier["test"].labels)
        val = Predictions(classifier["val"].logits.argmax(1), classifier["val"].labels)
        theta = osa_threshold(score(data["val"]), score(data["texture"]), val.pred, val.labels)[1]
        expect = reference_metrics(score(data["test"]), score(data["digits_6_9"]), test, theta)
        _assert_row(rows.loc[method], expect)
        assert rows.loc[method, "oosa_threshold"] == pytest.approx(theta)
        assert rows.loc[method, "auoscr"] <= rows.loc[method, "id_acc"] + 1e-12
        assert not np.isnan(rows.loc[method, "oosa"]) or theta == 0


@pytest.mark.slow
def test_without_ood_validation_osa_and_oosa_are_missing(digits, tmp_path):
    results = run_config(eval_config(digits, tmp_path / "run", detectors=["msp"]))
    assert results["osa"].isna().all() and results["oosa"].isna().all() and results["oosa_threshold"].isna().all()
    for column in ("tnr10", "tnr20", "ap_out", "fpr95_ref", "auoscr", "openauc"):
        assert results[column].notna().all(), column
    train, feats = _features(digits)
    msp = build("msp").fit(train.to_featureset())
    row = results[results.ood_set == "digits_6_9"].iloc[0]
    test = Predictions(feats["test"].logits.argmax(1), feats["test"].labels)
    _assert_row(row, reference_metrics(msp.score(feats["test"]), msp.score(feats["digits_6_9"]), test, None))


def test_row_helpers():
    """No predictions: the known-class columns NaN; the protocol decides a zero threshold's OSA."""
    rng = np.random.default_rng(0)
    id_scores, ood_scores = rng.normal(1, 1, 20), rng.normal(0, 1, 15)
    logits, labels = rng.normal(size=(20, 3)), rng.integers(0, 3, 20)
    known = KnownClasses(from_logits(logits, labels), None)
    assert known.accuracy == pytest.approx(np.mean(logits.argmax(1) == labels))
    assert np.isnan(KnownClasses().accuracy) and from_logits(None, labels) is None
    blank = openset_columns(id_scores, ood_scores, KnownClasses(), None, "open-insects")
    assert np.isnan(blank["auoscr"]) and np.isnan(blank["openauc"]) and not np.isnan(blank["tnr10"])
    zero_ref = openset_columns(id_scores, ood_scores, known, 0.0, "open-insects")
    zero_exact = openset_columns(id_scores, ood_scores, known, 0.0, "exact")
    assert np.isnan(zero_ref["oosa"]) and not np.isnan(zero_exact["oosa"])
    assert oosa_threshold(id_scores, ood_scores, None) is None
    assert oosa_threshold(id_scores, ood_scores, known.test) == osa_threshold(id_scores, ood_scores, logits.argmax(1),
                                                                              labels)[1]


@pytest.mark.slow
def test_a_swept_unit_picks_its_threshold_at_its_defaults_as_the_reference(digits, tmp_path):
    """Open-Insect picks the OOSA threshold before its APS sweep (ood_evaluator.py:102-131): under `open-insects` the
    threshold comes from the unit's default parameters, under `exact` from the selected point's. ReAct: its fit reads
    ID val only (a KNN bank would be ID train features through the protocol's fit pixels)."""
    _, ood_dir, _ = digits
    config = dict(ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}], detectors=["react"],
                  select={"ood_val": {"manifest": str(ood_dir), "split": "test", "sets": ["texture"]}})
    train, feats = _features(digits)
    val = Predictions(feats["val"].logits.argmax(1), feats["val"].labels)
    for protocol in ("open-insects", "exact"):
        row = run_config(eval_config(digits, tmp_path / protocol, protocol=protocol, **config)).iloc[0]
        chosen = json.loads(row["params"])["percentile"]
        assert chosen != build("react").params["percentile"]  # the sweep left the default (90): the two differ
        scorer = build("react", **({} if protocol == "open-insects" else {"percentile": chosen}))
        scorer.fit(train.to_featureset(), head=train.head(), id_val=feats["val"])
        theta = osa_threshold(scorer.score(feats["val"]), scorer.score(feats["texture"]), val.pred, val.labels)[1]
        assert row["oosa_threshold"] == pytest.approx(theta), protocol
