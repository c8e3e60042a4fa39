"""README "Your own data": its command blocks, run verbatim through the scripts on generated folders: class folders to
a report (`microsoft/resnet-50` resolved offline to the tiny stand-in); CPU stand-ins, class names surviving training
and a field set from folders; the container curation on an ImageNet-21K-shaped tree (the CLIP id resolved offline to
the tiny CLIP)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipelines.classifier import ImageClassifier
from pipelines.data import make_row, read_manifest, write_manifest
from tests.pipelines.own_data_helpers import COLOURS, SNAPSHOT, class_tree, fake_hub_cache, ood_tree, png

ROOT = Path(__file__).resolve().parents[2]


def readme_commands(block: int = 0) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Your own data", 1)[1].split("\n## ", 1)[0]
    code = section.split("```bash")[1 + block].split("```", 1)[0]
    return [line.strip() for line in code.strip().splitlines() if line.strip()]


def _env(tmp_path: Path, hub: Path) -> dict[str, str]:
    for name in ("scripts", "configs"):
        if not (tmp_path / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def _run(commands: list[str], cwd: Path, env: dict[str, str]) -> None:
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_readme_commands_take_class_folders_to_a_report(tmp_path):
    commands = readme_commands()
    assert len(commands) == 3
    class_tree(tmp_path / "photos", {"train": 8, "val": 3, "test": 3})
    ood_tree(tmp_path / "new_photos")
    for name in ("scripts", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(fake_hub_cache(tmp_path / "hub")),
           "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    names = json.loads((tmp_path / "data" / "own" / "class_names.json").read_text())["names"]
    assert names == ["ant", "bee", "cat"]
    model = tmp_path / "runs" / "own" / "classifier"
    metrics = json.loads((model / "metrics.json").read_text())
    assert set(metrics["top1"]) == {"val", "test"} and 0 <= metrics["id_acc"] <= 1
    assert ImageClassifier.from_pretrained(model).class_names == names  # what `model:` in eval configs loads
    results = pd.read_csv(tmp_path / "runs" / "own" / "results.csv")
    assert set(results["ood_set"]) == {"moths", "rocks"} and set(results["method"]) >= {"msp", "mds"}
    # the evaluation sees the pixels training tested with (protocol exact in both configs; openood_v1.5's bilinear
    # reference resize moved one image of 750 in a Fashion-MNIST run: 81.33% in metrics.json, 81.20% in evaluate)
    assert results.dropna(subset=["id_acc"])["id_acc"].iloc[0] == pytest.approx(metrics["id_acc"], abs=1e-12)
    assert (tmp_path / "runs" / "own" / "report" / "per_set.md").is_file()


@pytest.mark.slow
def test_readme_cpu_stand_ins_keep_class_names_and_import_a_field_set(tmp_path):
    commands = readme_commands(1)
    assert len(commands) == 3 and commands[0].startswith(("python scripts/make_tiny.py", "oodforge make-tiny"))
    photos = class_tree(tmp_path / "photos", {"train": 4, "val": 1, "test": 1})
    rng = np.random.default_rng(5)
    for name in ("bee", "cat", "moth_x"):  # two known species, one novel
        for i in range(2):
            png(tmp_path / "field_photos" / name / f"{i}.png", COLOURS.get(name, (90, 90, 90)), rng)
    env = _env(tmp_path, tmp_path / "no_hub")
    _run([readme_commands(0)[0].split(" && ")[0]], tmp_path, env)  # the first block's import of photos/
    _run([c if "train_classifier" not in c else c + " batch_size=6 image_size=32" for c in commands], tmp_path, env)
    model = tmp_path / "runs" / "own" / "classifier"
    assert json.loads((model / "class_names.json").read_text())["names"] == ["ant", "bee", "cat"]
    assert ImageClassifier.from_pretrained(model).class_names == ["ant", "bee", "cat"]
    rows = read_manifest(tmp_path / "data" / "own_field", check_files=True).rows
    assert {(r["species"], r["label"]) for r in rows if r["role"] == "id"} == {("bee", 1), ("cat", 2)}
    assert {(r["species"], r["ood_set"]) for r in rows if r["role"] == "ood"} == {("moth_x", "field")}
    assert photos.is_dir()


def test_species_rows_name_the_trained_model_classes(tmp_path, single_torch_thread):
    """A manifest with `species` and no class_names.json (what make_splits writes) keeps the species names."""
    from pipelines.tiny import RESNET_ID, save_tiny_model
    from pipelines.training.classify import train_classifier
    from pipelines.training.recipes import TrainConfig

    rng = np.random.default_rng(0)
    species = ["Actias luna", "Zale lunata"]
    rows = []
    for label, name in enumerate(species):
        for i in range(4):
            png(tmp_path / "img" / f"{label}_{i}.png", (200 * label, 80, 80), rng)
            rows.append(make_row(f"{label}_{i}.png", split="train" if i < 3 else "test", role="id", label=label,
                                 species=name, genus=name.split()[0]))
    rows.append(make_row("0_0.png", split="train", role="ood", ood_set="auxiliary", species="Other moth"))
    rows[-1]["file_name"] = "aux.png"
    png(tmp_path / "img" / "aux.png", (1, 2, 3), rng)
    write_manifest(tmp_path / "img", rows)
    model = save_tiny_model(tmp_path / "tiny", RESNET_ID)
    out = train_classifier(TrainConfig.from_dict({"id": str(tmp_path / "img"), "model": str(model), "pretrained": False,
                                                  "out": str(tmp_path / "clf"), "epochs": 1, "warmup_epochs": 0,
                                                  "batch_size": 6, "image_size": 32, "num_workers": 0}))
    saved = json.loads((out / "class_names.json").read_text())
    assert saved["names"] == species and saved["label_field"] == "species"
    assert ImageClassifier.from_pretrained(out).class_names == species


@pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(),
                    reason="WordNet 3.0 is not installed (apt-get install wordnet-base)")
@pytest.mark.slow
def test_readme_container_curation_command(tmp_path):
    from pipelines.tiny import CLIP_ID, save_tiny_clip
    from tests.pipelines.curation.test_containers import IMAGENET1K_CONTAINERS, NEW_CONTAINERS, imagenet21k_tree

    commands = readme_commands(2)
    assert len(commands) == 1 and "--filter" in commands[0]
    imagenet21k_tree(tmp_path / "imagenet21k")
    repo = tmp_path / "hub" / f"models--{CLIP_ID.replace('/', '--')}"
    save_tiny_clip(repo / "snapshots" / SNAPSHOT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    _run(commands, tmp_path, _env(tmp_path, tmp_path / "hub"))
    out = tmp_path / "data" / "containers"
    record = json.loads((out / "curation.json").read_text())
    assert record["filter"]["model"] == CLIP_ID and record["filter"]["threshold"] == 0.5
    assert set(record["imagenet1k_removed"]) == set(IMAGENET1K_CONTAINERS)
    kept = read_manifest(out).rows
    assert {r["wnid"] for r in kept} <= set(NEW_CONTAINERS)
    assert len(kept) + record["images_dropped"] == sum(NEW_CONTAINERS.values())
    assert (out / "categories.png").is_file() and (out / "dropped.csv").is_file()
