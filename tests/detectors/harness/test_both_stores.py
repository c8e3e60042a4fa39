"""The same end-to-end runs on a folder manifest and on the same data packed into shards (`pipelines.shards`, bytes
unchanged: resize none) give bitwise-equal features, scores and weights: feature extraction (shard members read in
DataLoader worker processes), an evaluation through the runner with an image-level detector and a field set, a
classifier training epoch and a fine-tune."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from detectors.harness.evaluate import run_config
from pipelines.classifier import ImageClassifier
from pipelines.data import make_row, read_manifest, write_manifest
from pipelines.features import extract_features
from pipelines.shards import PackConfig, pack_manifest
from pipelines.store import MemberPath

pytestmark = pytest.mark.slow  # its module fixture alone takes seconds (make test-fast leaves it out)

SAME_BYTES = PackConfig(samples_per_shard=64, resize="none")


def _field_manifest(digits: tuple[Path, Path, Path], folder: Path) -> Path:
    """A field set: a few ID test digits (known species) and digits 6-9 (novel), copied into `folder`."""
    id_dir, ood_dir, _ = digits
    rows = []
    for source, manifest in ((id_dir, read_manifest(id_dir).select(split="test", role="id")),
                             (ood_dir, read_manifest(ood_dir).select(ood_set="digits_6_9"))):
        for row in manifest.rows[:12]:
            (folder / row["file_name"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / row["file_name"], folder / row["file_name"])
            ood = row["role"] == "ood"
            rows.append(make_row(row["file_name"], split="test", role=row["role"], label=row["label"],
                                 ood_set="field_new" if ood else None, species=f"sp{row.get('digit', row['label'])}"))
    write_manifest(folder, rows)
    return folder


def _subset(source: Path, folder: Path, per_split: int) -> Path:
    """A metadata-only manifest of `per_split` rows of each (split, role, ood_set) of `source`, taken label by label in
    turn (the digits are written class by class: the first rows alone would be one class, which training refuses)."""
    from pipelines.importers import write_external_manifest

    manifest, taken, rows, counts, turn = read_manifest(source), {}, [], {}, []
    for r in manifest.rows:  # each row's place among its label's rows: every label's k-th row before any (k+1)-th
        label = (r["split"], r["role"], r["ood_set"], r["label"])
        counts[label] = counts.get(label, 0) + 1
        turn.append(counts[label])
    for _, row in sorted(zip(turn, manifest.rows), key=lambda pair: pair[0]):
        key = (row["split"], row["role"], row["ood_set"])
        if taken.setdefault(key, 0) < per_split:
            taken[key] += 1
            rows.append(row)
    write_external_manifest(folder, rows, manifest.root)
    return folder


@pytest.fixture(scope="module")
def stores(digits, tmp_path_factory):
    """{"folder": (id, ood, field), "shards": the same three packed into shard manifests} and the model folder: small
    subsets of the digits data, so that each run stays short."""
    base = tmp_path_factory.mktemp("stores")
    folder = (_subset(digits[0], base / "id", 60), _subset(digits[1], base / "ood", 30),
              _field_manifest(digits, base / "field"))
    shards = []
    for source in folder:
        pack_manifest(source, base / "shards" / source.name, SAME_BYTES)
        shards.append(base / "shards" / source.name)
    return {"folder": folder, "shards": tuple(shards)}, digits[2]


@pytest.mark.slow
def test_packed_manifests_point_into_shards(stores):
    (both, _) = stores
    for folder, packed in zip(both["folder"], both["shards"]):
        original, shard = read_manifest(folder), read_manifest(packed, check_files=True)
        assert [r["file_name"] for r in original.rows] == [r["file_name"] for r in shard.rows]
        assert all(isinstance(shard.path(r), MemberPath) for r in shard.rows)
        assert all(original.path(a).read_bytes() == shard.path(b).read_bytes()
                   for a, b in zip(original.rows, shard.rows))


def test_features_are_bitwise_equal_with_workers_reading_shards(stores):
    (both, model) = stores
    clf = ImageClassifier.from_pretrained(model)
    folder = read_manifest(both["folder"][0]).select(split="train")
    shards = read_manifest(both["shards"][0]).select(split="train")
    a = extract_features(clf, folder, batch_size=16)
    b = extract_features(clf, shards, batch_size=16, num_workers=2)  # forked workers open the shards themselves
    assert len(a.index) == len(folder) == 60
    for name in ("features", "logits", "labels", "index"):
        assert torch.equal(torch.as_tensor(getattr(a, name)), torch.as_tensor(getattr(b, name))), name


def test_runner_scores_and_tables_are_bitwise_equal(stores, tmp_path):
    (both, model) = stores
    results, scores = {}, {}
    for store, (id_dir, ood_dir, field) in both.items():
        out = tmp_path / store
        config = {"model": str(model), "id": str(id_dir), "out": str(out),
                  "ood": [{"manifest": str(ood_dir), "sets": ["digits_6_9", "texture"]}],
                  "field": [{"manifest": str(field)}], "detectors": ["msp", "knn", "odin"],
                  "threshold_transfer": [{"source": "digits_6_9", "tpr": 0.95, "targets": ["field_new"]}]}
        results[store] = run_config(config).drop(columns=["seconds"])
        scores[store] = pd.read_parquet(out / "scores.parquet")
    assert set(results["folder"]["ood_set"]) >= {"digits_6_9", "texture"}
    pd.testing.assert_frame_equal(results["folder"], results["shards"], check_exact=True)
    keep = [c for c in scores["folder"].columns if c not in ("path", "manifest")]  # where the rows came from
    pd.testing.assert_frame_equal(scores["folder"][keep], scores["shards"][keep], check_exact=True)
    transfer = {s: pd.read_csv(tmp_path / s / "threshold_transfer.csv") for s in both}
    assert set(transfer["folder"]["target"]) == {"field_new"}
    pd.testing.assert_frame_equal(transfer["folder"], transfer["shards"], check_exact=True)


def test_a_training_epoch_gives_bitwise_equal_weights(stores, tmp_path):
    from pipelines.tiny import save_tiny_model
    from pipelines.training.classify import train_classifier
    from pipelines.training.recipes import TrainConfig

    (both, _) = stores
    model = save_tiny_model(tmp_path / "tiny", "microsoft/resnet-50")
    weights = {}
    for store, (id_dir, _, _) in both.items():
        config = TrainConfig.from_dict({"id": str(id_dir), "out": str(tmp_path / store), "model": str(model),
                                        "epochs": 1, "warmup_epochs": 0, "batch_size": 32, "num_workers": 0,
                                        "image_size": 32})
        weights[store] = load_file(str(train_classifier(config) / "model.safetensors"))
    assert weights["folder"].keys() == weights["shards"].keys()
    assert all(torch.equal(weights["folder"][k], weights["shards"][k]) for k in weights["folder"])


def test_a_fine_tune_gives_bitwise_equal_weights(stores):
    from pipelines.training import finetune

    (both, model) = stores
    weights = {}
    for store, (id_dir, _, _) in both.items():
        clf = ImageClassifier.from_pretrained(model)
        finetune(clf, read_manifest(id_dir).select(split="val"), epochs=1, lr=1e-3, batch_size=16, warmup_epochs=0,
                 seed=3)
        weights[store] = {k: v.clone() for k, v in clf.state_dict().items()}
    assert all(torch.equal(weights["folder"][k], weights["shards"][k]) for k in weights["folder"])
    assert any(not torch.equal(weights["folder"][k], v)
               for k, v in ImageClassifier.from_pretrained(model).state_dict().items() if v.is_floating_point())


def test_the_run_key_follows_the_shard_digest_not_its_location(stores, tmp_path):
    from pipelines.fingerprint import images_fingerprint

    (both, _) = stores
    packed = both["shards"][0]
    moved = tmp_path / "moved"
    shutil.copytree(packed.parent, moved, copy_function=shutil.copy2)
    a, b = read_manifest(packed), read_manifest(moved / packed.name)
    assert images_fingerprint(a) == images_fingerprint(b) == images_fingerprint(b, "content")
    assert images_fingerprint(a) != images_fingerprint(read_manifest(both["folder"][0]))
    assert np.array_equal([r["label"] for r in a.rows], [r["label"] for r in b.rows])


@pytest.mark.slow
def test_two_processes_on_shards_give_one_process_on_the_folder(stores, tmp_path):
    """torchrun with 2 CPU processes reading the shard store: the same table as one process on the folder store."""
    import subprocess
    import sys

    import yaml

    (both, model) = stores
    config = {"model": str(model), "detectors": ["msp", "knn", "odin"],
              "ood": [{"manifest": str(both["shards"][1]), "sets": ["texture"]}], "id": str(both["shards"][0]),
              "out": str(tmp_path / "two")}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "scripts/evaluate.py", "--config",
                           str(path)], capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-3000:]
    two = pd.read_csv(tmp_path / "two" / "results.csv")
    one = run_config({**config, "id": str(both["folder"][0]), "ood": [{"manifest": str(both["folder"][1]),
                                                                      "sets": ["texture"]}],
                                                                      "out": str(tmp_path / "one")})
    columns = ["auroc", "fpr95", "fpr95_id", "aupr_in", "aupr_out", "n_id", "n_ood"]
    pd.testing.assert_frame_equal(two[["method", "ood_set", *columns]], one[["method", "ood_set", *columns]],
                                  check_exact=False, atol=1e-6)
