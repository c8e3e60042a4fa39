"""Protocol test: the Open-Insects C-America protocol through the scripts, on a synthetic occurrence table with
generated images: make_splits -> train_classifier -> evaluate (configs/species_c-america.yaml as shipped: Table 2's
post-hoc methods, Table 7's training methods fine-tuning the classifier in full mode) -> report.

Only paths, training lengths and cluster counts change. Checks: every detector and every (training method, rule) pair
reports on every OOD set, training rows say mode "full", the fine-tuned methods are distinct from one another (heads
on frozen features would make several identical), threshold transfer runs on the field set alone, and the report is
written by the documented command.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from detectors.training.finetuned import CHECKPOINT
from gen.insects import load_region, synthetic_occurrences
from pipelines.checkpoints import load_tree
from pipelines.configfile import load_yaml
from pipelines.data import make_row, write_manifest

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "species_c-america.yaml"
REGION = "c-america"
SHORT = {"epochs": 1, "warmup_epochs": 0, "batch_size": 32}

pytestmark = pytest.mark.slow


def _script(name: str, *args: str, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _species_image(species: str, seed: int) -> Image.Image:
    """A 32 px image whose colour layout is the species' (a hash) plus per-image noise."""
    code = hashlib.sha256(str(species).encode()).digest()
    base = np.array(list(code[:12]), dtype=np.float32).reshape(2, 2, 3)
    pixels = np.kron(base, np.ones((16, 16, 1))) + np.random.default_rng(seed).normal(0, 12, (32, 32, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _splits(tmp: Path) -> Path:
    """make_splits.py on a synthetic table (6 ID species), then an image for every row of the region."""
    occ, ids = synthetic_occurrences(12000, n_species=150, seed=3)
    ids = ids[ids.region == REGION].head(6)
    occ.to_csv(tmp / "occ.csv", index=False)
    ids.to_csv(tmp / "ids.csv", index=False)
    _script("make_splits.py", "--occurrences", tmp / "occ.csv", "--id-species", tmp / "ids.csv", "--image-root",
            tmp / "images", "--out", tmp / "splits", "--target-taxon", "moth",
            "split.aux_species_by_region.c-america=10",
            "--aux-per-species", 5, "--non-local-cap", 3, "--local-cap", 6, "--id-cap", 14, "--non-target-cap", 30,
            cwd=tmp)
    region = load_region(tmp / "splits" / REGION)
    for i, row in enumerate(region.rows):
        path = region.path(row)
        path.parent.mkdir(parents=True, exist_ok=True)
        _species_image(row["species"], i).save(path)
    return tmp / "splits" / REGION


def _field(tmp: Path, splits: Path) -> Path:
    """A BCI-like field set: ID test images (its negatives) and local-OOD species as novel ones."""
    region = load_region(splits)
    field = tmp / "field"
    field.mkdir()
    rows = []
    for i, r in enumerate(region.select(split="test", role="id").rows[:8]):
        _species_image(r["species"], 10_000 + i).save(field / f"id_{i}.png")
        rows.append(make_row(f"id_{i}.png", split="test", role="id", label=r["label"], species=r["species"]))
    for i, r in enumerate(region.select(ood_set="local").rows[:8]):
        _species_image(r["species"], 20_000 + i).save(field / f"novel_{i}.png")
        rows.append(make_row(f"novel_{i}.png", split="test", role="ood", ood_set="bci", species=r["species"]))
    write_manifest(field, rows)
    return field


def _classifier(tmp: Path, splits: Path) -> Path:
    """train_classifier.py from the tiny ResNet-50 stand-in's config (random initialisation), a short recipe."""
    from pipelines.tiny import RESNET_ID, save_tiny_model

    save_tiny_model(tmp / "tiny_resnet", RESNET_ID)
    (tmp / "train.yaml").write_text(yaml.safe_dump({"id": str(splits), "model": str(tmp / "tiny_resnet"),
                                                    "pretrained": False,
                                                    "recipe": "open-insects-scratch", "out": str(tmp / "classifier")}))
    _script("train_classifier.py", "--config", tmp / "train.yaml", "epochs=2", "warmup_epochs=1", "batch_size=32",
            "lr=0.003", "seed=0", cwd=tmp)
    return tmp / "classifier"


def _eval_config(tmp: Path, splits: Path, field: Path, model: Path) -> Path:
    raw = load_yaml(CONFIG)  # the region file over species_base.yaml
    raw.update(model=str(model), id=str(splits), out=str(tmp / "run"),
               ood=[{**o, "manifest": str(splits)} for o in raw["ood"]],
               aux={**raw["aux"], "manifest": str(splits)}, ood_val={**raw["ood_val"], "manifest": str(splits)},
               field=[{"manifest": str(field)}])
    specs = [d if isinstance(d, dict) else {"name": d} for d in raw["detectors"]]
    for spec in specs:
        if "rules" in spec:  # the training methods: shorter fine-tuning, every other setting stays the config's
            spec["params"] = {**spec.get("params", {}), **SHORT}
        if spec["name"] == "udg":
            spec["params"].update(num_clusters=6, pca_dim=16)
        if spec["name"] == "opengan":
            spec["params"] = {"epochs": 3}
    raw["detectors"] = specs
    (tmp / "eval.yaml").write_text(yaml.safe_dump(raw))
    return tmp / "eval.yaml"


def test_species_protocol_through_the_scripts(tmp_path):
    splits = _splits(tmp_path)
    field = _field(tmp_path, splits)
    model = _classifier(tmp_path, splits)
    config = _eval_config(tmp_path, splits, field, model)
    _script("evaluate.py", "--config", config, cwd=tmp_path)
    run = tmp_path / "run"
    _script("report.py", "--results", run / "results.csv", "--scores", run / "scores.parquet", "--out",
            tmp_path / "report", cwd=tmp_path)

    failures = json.loads((run / "failures.json").read_text())
    assert failures["detectors"] == [], failures["detectors"]
    results = pd.read_csv(run / "results.csv", keep_default_na=False)
    raw = yaml.safe_load(config.read_text())
    trained = [d["name"] for d in raw["detectors"] if "rules" in d]
    posthoc = [d["name"] for d in raw["detectors"] if "rules" not in d]
    rules = raw["detectors"][len(posthoc)]["rules"]
    expected = {*posthoc, *trained, *(f"{t}+{r}" for t in trained for r in rules)}
    sets = {"local", "non_local", "non_target"}
    assert set(results["method"]) == expected and set(results["ood_set"]) == sets
    assert len(results) == len(expected) * len(sets)
    own_rows = results[results["method"].isin(trained)]
    assert (own_rows["mode"] == "full").all()

    # the fine-tuned methods are distinct: no two give the same ID test scores (heads-only training made several equal)
    scores = pd.read_parquet(run / "scores.parquet")
    id_scores = {m: scores[(scores.method == m) & (scores.role == "id")].sort_values("index")["score"].to_numpy()
                 for m in trained}
    for a, b in itertools.combinations(trained, 2):
        if len(id_scores[a]) == len(id_scores[b]):
            assert np.abs(id_scores[a] - id_scores[b]).max() > 1e-6, (a, b)
    # a rule scores each method's own fine-tuned features: KNN differs between methods
    knn = {t: scores[(scores.method == f"{t}+knn") & (scores.role == "id")].sort_values("index")["score"].to_numpy()
           for t in trained}
    assert len({np.round(v, 6).tobytes() for v in knn.values()}) == len(trained)

    transfer = pd.read_csv(run / "threshold_transfer.csv")
    assert set(transfer["target"]) == {"bci"} and (transfer["n_id"] == 8).all() and (transfer["n_ood"] == 8).all()
    assert (tmp_path / "report" / "best_rule.csv").is_file()


def test_open_insects_protocol_trains_as_the_reference_code(tmp_path):
    """splits -> classifier -> species config under `protocol: open-insects`, scaled down: the recipe values, the
    preprocessing, the schedule at steps 0 / 1 / warm-up end / last (against a transcription of the reference trainer
    loop), the training methods' protocol parameters and their fine-tuning schedules."""
    from tests.pipelines.training.test_training_schedule import trainer_lrs

    splits = _splits(tmp_path)
    from pipelines.tiny import RESNET_ID, save_tiny_model

    save_tiny_model(tmp_path / "tiny_resnet", RESNET_ID)
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({"id": str(splits), "model": str(tmp_path / "tiny_resnet"),
                                                         "pretrained": False, "recipe": "open-insects-scratch",
                                                         "out": str(tmp_path / "classifier")}))
    _script("train_classifier.py", "--config", tmp_path / "train.yaml", "epochs=4", "warmup_epochs=2", "batch_size=16",
            cwd=tmp_path)
    model = tmp_path / "classifier"
    config = json.loads((model / "train_config.json").read_text())
    assert {k: config[k] for k in ("protocol", "schedule", "drop_last", "precision", "augment", "image_size",
                                   "pre_size", "lr", "weight_decay", "pretrained")} == {
        "protocol": "open-insects", "schedule": "reference", "drop_last": False, "precision": "fp32", "augment": "ami",
        "image_size": 126, "pre_size": 128, "lr": 0.01, "weight_decay": 1e-5, "pretrained": False}
    processor = json.loads((model / "preprocessor_config.json").read_text())
    assert int(126 / processor["crop_pct"]) == 128 and processor["resample"] == 2  # eval: Resize(128) + CenterCrop(126)
    from pipelines.data import read_manifest

    n_train = len(read_manifest(splits).select(role="id", split="train"))
    metrics = json.loads((model / "metrics.json").read_text())
    want = trainer_lrs(4, 2, n_train, 16, 0.01)
    batches, spe = -(-n_train // 16), int(n_train / 16) + 1
    assert metrics["steps"] == 4 * batches  # the last partial batch kept
    at = metrics["lr_at"]
    assert (at["step_0"] == 0.0 and at["step_1"] == pytest.approx(want[1])
            and at["warmup_end"] == pytest.approx(want[2 * batches]))
    assert at["step_1"] == pytest.approx(0.01 * (spe + 1) / (2 * spe))  # the warm-up starts halfway
    assert at["last"] == pytest.approx(want[-1]) and at["last"] == 0.0  # the last epoch at lr 0

    raw = load_yaml(CONFIG)  # the region file over species_base.yaml
    fine_tune = {"epochs": 2, "warmup_epochs": 1, "batch_size": 16}
    raw.update(model=str(model), id=str(splits), out=str(tmp_path / "run"), protocol="open-insects",
               ood=[{**o, "manifest": str(splits)} for o in raw["ood"]], aux={**raw["aux"], "manifest": str(splits)},
               ood_val={**raw["ood_val"], "manifest": str(splits)},
               detectors=["msp", {"name": "mcd", "params": fine_tune}, {"name": "logitnorm", "params": fine_tune}])
    raw.pop("field"), raw.pop("threshold_transfer", None)
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(raw))
    _script("evaluate.py", "--config", tmp_path / "eval.yaml", cwd=tmp_path)
    results = pd.read_csv(tmp_path / "run" / "results.csv", keep_default_na=False)
    assert set(results["protocol"]) == {"open-insects"}
    params = {m: json.loads(results[results.method == m]["params"].iloc[0]) for m in ("mcd", "logitnorm")}
    for name in params:
        assert ((params[name]["schedule"], params[name]["drop_last"], params[name]["augment"])
                == ("reference", False, "region"))
    assert params["mcd"]["start_epoch_ft"] == 90
    for name, advances in (("mcd", True), ("logitnorm", False)):
        checkpoints = list((tmp_path / "run").rglob(f"*{name}*/**/{CHECKPOINT}"))
        assert len(checkpoints) == 1, checkpoints
        lrs = load_tree(checkpoints[0])["lrs"].tolist()
        assert lrs == pytest.approx(trainer_lrs(2, 1, n_train, 16, 1e-3, advances)), name
