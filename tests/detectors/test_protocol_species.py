"""Protocol test: configs/species_c-america.yaml end to end on a synthetic occurrence table with generated images.

The shipped config is read as it is; only paths point at the synthetic splits, a field set and a tiny classifier, and
training lengths shrink. Checks: every detector and every (training method, post-hoc rule) pair reports on every OOD
set, the auxiliary rows are the auxiliary set only, threshold transfer runs on the field set alone, and the
best-rule report picks, per training method, the rule with the best local AUROC (checked independently).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from detectors.evaluate import run_config
from detectors.report import write_report
from gen.insects import SplitConfig, make_splits, synthetic_occurrences
from pipelines.data import make_row, read_manifest, write_manifest

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "species_c-america.yaml"
REGION = "c-america"


def _species_image(species: str, seed: int) -> Image.Image:
    """A 32 px image whose colour layout is the species' (a hash) plus per-image noise."""
    code = hashlib.sha256(species.encode()).digest()
    base = np.array(list(code[:12]), dtype=np.float32).reshape(2, 2, 3)
    rng = np.random.default_rng(seed)
    pixels = np.kron(base, np.ones((16, 16, 1))) + rng.normal(0, 12, (32, 32, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _classifier(manifest, folder: Path, n_classes: int) -> Path:
    import torch
    from transformers import ResNetForImageClassification

    from pipelines.classifier import ImageClassifier
    from pipelines.toydata import tiny_digit_classifier_config
    from pipelines.training import finetune

    torch.manual_seed(0)
    config, processor = tiny_digit_classifier_config()
    config.id2label = {i: f"species {i}" for i in range(n_classes)}
    config.label2id = {v: k for k, v in config.id2label.items()}
    ResNetForImageClassification(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    clf = ImageClassifier.from_pretrained(folder)
    finetune(clf, manifest.select(split="train", role="id"), epochs=3, lr=3e-3, batch_size=32, warmup_epochs=0, seed=0)
    clf.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_species_config_end_to_end(tmp_path):
    occ, ids = synthetic_occurrences(12000, n_species=150, seed=3)
    ids = ids[ids.region == REGION].head(8)
    split_config = SplitConfig(aux_species_by_region={REGION: 12}, aux_per_species=6, non_local_cap=4, target_taxon="moth")
    images = tmp_path / "images"
    folders, _ = make_splits(occ, ids, tmp_path / "splits", images, split_config)
    region = read_manifest(folders[REGION])
    for i, row in enumerate(region.rows):  # images only for the rows the region's manifest names
        path = region.path(row)
        path.parent.mkdir(parents=True, exist_ok=True)
        _species_image(row["species"], i).save(path)
    n_classes = max(r["label"] for r in region.rows) + 1
    model = _classifier(region, tmp_path / "clf", n_classes)

    # the BCI-like field set: some ID test images (its negatives) and local-OOD images as novel species
    field = tmp_path / "field"
    field.mkdir()
    rows = []
    for i, r in enumerate(region.select(split="test", role="id").rows[:10]):
        _species_image(r["species"], 10_000 + i).save(field / f"id_{i}.png")
        rows.append(make_row(f"id_{i}.png", split="test", role="id", label=r["label"], species=r["species"]))
    for i, r in enumerate(region.select(ood_set="local").rows[:12]):
        _species_image(r["species"], 20_000 + i).save(field / f"novel_{i}.png")
        rows.append(make_row(f"novel_{i}.png", split="test", role="ood", ood_set="bci", species=r["species"]))
    write_manifest(field, rows)

    raw = yaml.safe_load(CONFIG.read_text())
    splits = str(folders[REGION])
    raw.update(model=str(model), id=splits, out=str(tmp_path / "run"), batch_size=64,
               ood=[{**o, "manifest": splits} for o in raw["ood"]], aux={**raw["aux"], "manifest": splits},
               ood_val={**raw["ood_val"], "manifest": splits}, field=[{"manifest": str(field)}])
    raw["detectors"] = [d if isinstance(d, dict) else {"name": d} for d in raw["detectors"]]
    for spec in raw["detectors"]:  # shorter training; every other setting stays the config's
        if spec["name"] in {"confbranch", "logitnorm", "arpl", "godin", "oe", "mixoe", "energy_oe", "udg", "novel_branch",
                            "extended", "rotpred"}:
            spec["params"] = {**spec.get("params", {}), "epochs": 2, "warmup_epochs": 0, "batch_size": 64}
        if spec["name"] == "udg":
            spec["params"].update(num_clusters=8, pca_dim=16)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    results = run_config(tmp_path / "config.yaml")

    failures = json.loads((tmp_path / "run" / "failures.json").read_text())
    assert failures["detectors"] == [], failures["detectors"]
    sets = {"local", "non_local", "non_target"}
    assert set(results["ood_set"]) == sets
    rules = ["msp", "ebo", "mls", "react", "vim", "knn", "mds"]
    trained = ["confbranch", "logitnorm", "arpl", "godin", "oe", "mixoe", "energy_oe", "udg", "novel_branch", "extended"]
    expected = {"msp", "ebo", "mls", "odin", "react", "vim", "knn", "mds", "rotpred", *trained,
                *(f"{t}+{r}" for t in trained for r in rules)}
    assert set(results["method"]) == expected
    assert len(results) == len(expected) * len(sets)
    assert (results[results.rule != ""]["base"].isin(trained)).all()

    from pipelines.features import FeatureCache

    (aux_cache,) = (tmp_path / "run" / "cache").glob("aux-aux-*.safetensors")  # the auxiliary rows and nothing else
    assert len(FeatureCache.load(aux_cache)) == len(region.select(split="train", ood_set="auxiliary")) > 0

    transfer = pd.read_csv(tmp_path / "run" / "threshold_transfer.csv")
    assert set(transfer["target"]) == {"bci"} and (transfer["n_id"] == 10).all() and (transfer["n_ood"] == 12).all()

    write_report(results, tmp_path / "report", best_rule_on="local")
    best = pd.read_csv(tmp_path / "report" / "best_rule.csv")
    local = results[(results.ood_set == "local") & (results.base != "")]
    for base, rows in local.groupby("base"):
        pick = rows.loc[rows["auroc"].idxmax()]  # the rule (or the method's own score) of best local AUROC
        got = best[best["base"] == base]
        assert len(got) == 1 and got["method"].iloc[0] == pick["method"], (base, got, pick["method"])
