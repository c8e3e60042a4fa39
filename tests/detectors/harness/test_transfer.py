"""Threshold transfer to a field set (Open-Insects field test): arithmetic by hand, then through the runner."""
import json
import shutil

import numpy as np
import pandas as pd
import pytest
from runner_helpers import eval_config

from detectors.harness.evaluate import run_config
from detectors.harness.transfer import transfer_table
from detectors.metrics import threshold_at_tpr
from pipelines.data import make_row, read_manifest, write_manifest


def _frame(role, ood_set, scores):
    return pd.DataFrame({"method": "m", "family": "posthoc", "role": role, "ood_set": ood_set, "group": "",
                         "index": np.arange(len(scores)), "score": scores})


def test_field_set_precision_recall_and_species_by_hand():
    scores = pd.concat([
        _frame("id", "id", [0.9, 0.8, 0.7, 0.6]),
        _frame("ood", "local", [0.1, 0.2, 0.3, 0.4, 0.5]),
        _frame("field_id", "bci", [0.35, 0.45, 0.9]),
        _frame("field_ood", "bci", [0.1, 0.3, 0.6, 0.2, 0.95]),
    ])
    species = {"bci": {0: "A", 1: "A", 2: "B", 3: "C", 4: "C"}}
    table = transfer_table([{"source": "local", "tpr": 0.8, "targets": ["bci", "local"]}], scores, species)
    bci = table[table.target == "bci"].iloc[0]
    # 80% of the 5 local scores flagged -> threshold just above 0.4; flagged: field ID 0.35; novel 0.1, 0.3, 0.2
    assert bci["threshold"] == pytest.approx(0.4) and bci["threshold"] > 0.4
    assert (bci["tp"], bci["fp"], bci["n_id"], bci["n_ood"]) == (3, 1, 3, 5)
    assert bci["precision"] == pytest.approx(3 / 4) and bci["recall"] == pytest.approx(3 / 5)
    assert bci["species_detected"] == pytest.approx(3 / 5)  # image share over the novel species
    assert bci["species_any"] == pytest.approx(2 / 3) and bci["n_novel_species"] == 3  # A and C, not B
    local = table[table.target == "local"].iloc[0]  # a benchmark OOD target: negatives are the benchmark's ID test
    assert (local["tp"], local["fp"]) == (4, 0)


def test_field_set_through_the_runner(digits, tmp_path):
    """Field ID rows are the negatives; a broken novel image is excluded from scores and species alike."""
    id_dir, ood_dir, model = digits
    idm, oodm = read_manifest(id_dir), read_manifest(ood_dir)
    field = tmp_path / "field"
    field.mkdir()
    rows = []
    for r in idm.select(split="val", role="id").rows[:12]:
        shutil.copy(idm.path(r), field / f"id_{r['file_name'].replace('/', '_')}")
        rows.append(make_row(f"id_{r['file_name'].replace('/', '_')}", split="test", role="id", label=r["label"]))
    for i, r in enumerate(oodm.select(ood_set="digits_6_9").rows[:10]):
        name = f"novel_{i}.png"
        shutil.copy(oodm.path(r), field / name)
        rows.append(make_row(name, split="test", role="ood", ood_set="bci", species=f"sp{i % 3}"))
    (field / "novel_4.png").write_bytes(b"broken")
    write_manifest(field, rows)
    out = tmp_path / "run"
    run_config(eval_config(digits, out, detectors=["msp"], ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                           field=[{"manifest": str(field)}],
                           threshold_transfer=[{"source": "digits_6_9", "tpr": 0.95, "targets": ["bci"]}]))
    scores = pd.read_parquet(out / "scores.parquet")
    novel = scores[scores.role == "field_ood"]
    known = scores[scores.role == "field_id"]
    assert len(known) == 12 and len(novel) == 9 and 4 not in set(novel["index"])  # rows 0-9 of the novel selection
    assert [f["file"] for f in json.loads((out / "failures.json").read_text())["images"]] == ["novel_4.png"]
    threshold = threshold_at_tpr(scores[scores.ood_set == "digits_6_9"]["score"], 0.95, "ood")
    flagged = novel["score"].to_numpy() < threshold
    tp, fp = int(flagged.sum()), int((known["score"].to_numpy() < threshold).sum())
    row = pd.read_csv(out / "threshold_transfer.csv").iloc[0]
    assert (row["tp"], row["fp"], row["n_ood"], row["n_id"]) == (tp, fp, 9, 12)
    assert row["recall"] == pytest.approx(tp / 9) and row["species_detected"] == pytest.approx(tp / 9)
    selected = read_manifest(field).select(split="test", role="ood")
    by_species = pd.Series(flagged).groupby([selected.rows[i]["species"] for i in novel["index"]]).any()
    assert row["species_any"] == pytest.approx(by_species.mean())
