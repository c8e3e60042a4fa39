"""Protocol test: configs/shiftedbronzes.yaml end to end on a scaled synthetic replica.

The shipped config is read as it is; only paths (data, models) point at the replica and tiny stand-ins, and training
lengths shrink. Every one of its 18 detectors must produce a row for each of the 9 OOD sets in their groups, and the
report's Table 4 (family x group) must equal plain means over methods computed here independently.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from replicas import ood_sets, subsample_id

from detectors.harness.evaluate import run_config
from detectors.harness.report import write_report

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "shiftedbronzes.yaml"


def _tiny_clipn(clip: Path, folder: Path, class_names: list[str]) -> Path:
    """A CLIPN trained for one epoch on a few replica images with the tiny CLIP (stands in for the converted
    release)."""
    import detectors
    from detectors.base import ImageSet

    det = detectors.build("clipn", model=str(clip), class_names=class_names, epochs=1, train_batch=4, progress=False)
    from PIL import Image

    images = [Image.new("RGB", (32, 32), (40 * i, 255 - 40 * i, 128)) for i in range(6)]
    det.fit(ImageSet(images=images, labels=np.arange(6)))
    return det.save_pretrained(folder)


def _val_set(ood_dir: Path, out: Path, n: int) -> Path:
    """OOD-validation rows: the last `n` textures of the pool, which no replica test set takes (the leak guard refuses
    validation images that are byte copies of test images)."""
    import shutil

    from pipelines.data import make_row, read_manifest, write_manifest

    pool = read_manifest(ood_dir).select(ood_set="texture")
    out.mkdir(parents=True)
    for i, row in enumerate(pool.rows[-n:]):
        shutil.copy(pool.path(row), out / f"val_{i}.png")
    write_manifest(out, [make_row(f"val_{i}.png", split="val", role="ood", ood_set="ood_val") for i in range(n)])
    return out


@pytest.mark.slow
def test_shiftedbronzes_config_end_to_end(digits, tmp_path):
    from pipelines.tiny import save_tiny_clip, save_tiny_pixel_unet

    raw = yaml.safe_load(CONFIG.read_text())
    groups = {name: src["group"] for src in raw["ood"] for name in src["sets"]}
    id_dir = subsample_id(digits[0], tmp_path / "bronze", {"train": 16, "val": 4, "test": 4})
    folders = ood_sets(digits[1], tmp_path / "ood", groups, per_set=6)
    val = {"ood_val": _val_set(digits[1], tmp_path / "ood_val", 6)}
    clip, unet = save_tiny_clip(tmp_path / "clip"), save_tiny_pixel_unet(tmp_path / "unet")
    names = [f"digit {c}" for c in range(6)]

    raw.update(model=str(digits[2]), id=str(id_dir), out=str(tmp_path / "run"), batch_size=16,
               ood=[{**src, "manifest": str(folders[src["sets"][0]])} for src in raw["ood"]],
               ood_val={**raw["ood_val"], "manifest": str(val["ood_val"])})
    tiny = {  # stand-ins and shortened training; every other parameter stays the config's
        "clipn": {"load": str(_tiny_clipn(clip, tmp_path / "clipn", names)), "params": {"model": str(clip)}},
        "locoop": {"params": {"model": str(clip), "epochs": 1}},
        "idlike": {"params": {"model": str(clip), "epochs": 1, "n_crops": 8, "n_select": 2, "n_ood_prompts": 8}},
        "diffguard": {"params": {"unet_id": str(unet), "steps": 6, "max_inversion_steps": 5, "n_crops": 1,
                                 "distance": "ssim", "early_stop_similarity": None, "batch_size": 16}},
        "opengan": {"params": {"epochs": 2}},
    }
    for spec in raw["detectors"]:
        change = tiny.get(spec["name"], {})
        spec.update({k: v for k, v in change.items() if k != "params"})
        spec["params"] = {**spec.get("params", {}), **change.get("params", {})}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))

    results = run_config(tmp_path / "config.yaml")
    failures = (tmp_path / "run" / "failures.json").read_text()
    assert results["method"].nunique() == 18, failures
    assert len(results) == 18 * 9 and results[["auroc", "fpr95"]].notna().all().all()
    assert dict(zip(results["ood_set"], results["group"])) == groups
    assert set(results["family"]) == {"posthoc", "clip", "generative"}

    write_report(results, tmp_path / "report")
    table4 = pd.read_csv(tmp_path / "report" / "sb_table4.csv")
    # independent: per family, the mean over methods of each method's mean over the group's sets (percent)
    for family, rows in results.groupby("family"):
        for group in ("hard", "easy"):
            per_method = rows[rows.group == group].groupby("method")[["auroc", "fpr95"]].mean()
            expect = 100 * per_method.mean()
            got = table4[table4.iloc[:, 0] == family]
            for metric in ("auroc", "fpr95"):
                column = [c for c in table4.columns if group in c.lower() and metric in c.lower()]
                assert column, table4.columns
                assert float(got[column[0]].iloc[0]) == pytest.approx(expect[metric], abs=0.006)
