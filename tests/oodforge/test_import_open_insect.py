"""Commands only, as a user runs them from an empty folder: a folder in the reference download.py's layout (the
stand-in of `helpers.open_insect`) -> `oodforge import-open-insect` (the region, then the BCI field set) ->
`oodforge make-tiny classifier` -> `oodforge train-classifier` -> `oodforge evaluate --config
configs/species_c-america.yaml model=...` (the shipped file: its `id`, `ood`, `aux`, `ood_val` and `field` paths are
the import's folders; only `model` and, for time, `detectors` given) -> `oodforge report`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers.open_insect import SIZES, category_map, download_folder, write_json

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "species_c-america.yaml"
CLASSES = 6
BCI = 5

pytestmark = pytest.mark.slow


def oodforge(*args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OODFORGE_PROGRESS": "off"}
    done = subprocess.run([sys.executable, "-m", "oodforge", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"oodforge {args[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def test_a_download_folder_imports_and_the_species_config_evaluates_it(tmp_path):
    download_folder(tmp_path / "open-insect", classes=CLASSES, bci=BCI)
    write_json(tmp_path / "c-america_category_map.json", category_map(CLASSES))
    oodforge("import-open-insect", "open-insect", "--region", "c-america", "--out", "splits", "--category-map",
             "c-america_category_map.json", cwd=tmp_path)
    oodforge("import-open-insect", "open-insect", "--bci", "--out", "data", cwd=tmp_path)
    oodforge("make-tiny", "classifier", "--out", "models/tiny_resnet", cwd=tmp_path)
    (tmp_path / "train.yaml").write_text("id: splits/c-america\nmodel: models/tiny_resnet\npretrained: false\n"
                                         "recipe: open-insects-scratch\nout: runs/resnet50_c_america\n")
    oodforge("train-classifier", "--config", "train.yaml", "epochs=2", "warmup_epochs=1", "batch_size=16",
             cwd=tmp_path)
    names = json.loads((tmp_path / "runs" / "resnet50_c_america" / "class_names.json").read_text())["names"]
    assert names == list(category_map(CLASSES))  # the classifier's classes are the category map's speciesKeys

    detectors = "detectors=[msp, vim, {name: oe, rules: [msp], params: {epochs: 1, warmup_epochs: 0, batch_size: 16}}]"
    evaluate = ["evaluate", "--config", CONFIG, "model=runs/resnet50_c_america", detectors]
    plan = oodforge(*evaluate, "--dry-run", cwd=tmp_path)
    n = {name: size * (CLASSES if name.endswith("_id") else 1) for name, size in SIZES.items()}
    assert (f"id-id_train {n['train_id']}, id-id_val {n['val_id']}, id-id_test {n['test_id']}, "
            f"ood-local {n['test_ood_local']}, ood-non_local {n['test_ood_non-local']}, "
            f"ood-non_target {n['test_ood_non-moth']}, field_ood-bci {BCI}, ood_val-ood_val {n['val_ood']}, "
            f"aux-aux {n['train_aux']}") in plan  # every released split where the species config reads it
    oodforge(*evaluate, cwd=tmp_path)
    run = tmp_path / "runs" / "species_c_america"
    assert json.loads((run / "failures.json").read_text())["detectors"] == []
    results = pd.read_csv(run / "results.csv", keep_default_na=False)
    assert set(results["method"]) == {"msp", "vim", "oe", "oe+msp"}
    assert set(results["ood_set"]) == {"local", "non_local", "non_target"} and len(results) == 12
    assert (results["n_id"] == n["test_id"]).all()
    assert dict(zip(results["ood_set"], results["n_ood"])) == {
        "local": n["test_ood_local"], "non_local": n["test_ood_non-local"], "non_target": n["test_ood_non-moth"]}
    transfer = pd.read_csv(run / "threshold_transfer.csv")
    assert set(transfer["target"]) == {"bci"} and (transfer["n_ood"] == BCI).all() and (transfer["n_id"] == 0).all()

    oodforge("report", "--results", run / "results.csv", "--scores", run / "scores.parquet", "--splits", "splits",
             "--out", run / "report", cwd=tmp_path)
    assert (run / "report" / "index.html").is_file() and (run / "report" / "best_rule.csv").is_file()
