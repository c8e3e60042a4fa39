"""Both generative detectors through the evaluation runner (detectors.harness.evaluate) with a tiny transformers
classifier."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

import detectors
from detectors import ImageSet
from detectors.harness.evaluate import run_config
from pipelines.data import make_row, read_manifest, write_manifest


@pytest.fixture(scope="module")
def tiny_eval_data(tmp_path_factory):
    from transformers import ResNetForImageClassification

    from pipelines.tiny import save_tiny_pixel_unet
    from pipelines.toydata import tiny_digit_classifier_config

    root = tmp_path_factory.mktemp("gen_eval")
    rng = np.random.default_rng(0)
    id_rows, ood_rows = [], []
    images = {"id": [], "ood": []}
    for split, n in (("train", 12), ("val", 4), ("test", 6)):
        for i in range(n):
            label = i % 3
            name = f"{split}/{label}/{i}.png"
            images["id"].append((name, rng.uniform(0.3, 0.7) + 0.2 * label))
            id_rows.append(make_row(name, split=split, role="id", label=label, class_name=f"digit {label}"))
    for i in range(5):
        name = f"noise/{i}.png"
        images["ood"].append((name, None))
        ood_rows.append(make_row(name, split="test", role="ood", ood_set="noise", group="far"))
    for part, entries in images.items():
        for name, level in entries:
            path = root / part / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if level is None:
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            else:
                pixels = np.full((32, 32, 3), int(255 * min(level, 1.0)), dtype=np.uint8)
                pixels[8:24, 8:24] = 255 - pixels[8:24, 8:24]
            Image.fromarray(pixels).save(path)
    write_manifest(root / "id", id_rows)
    write_manifest(root / "ood", ood_rows)
    torch.manual_seed(0)
    config, processor = tiny_digit_classifier_config(num_labels=3)
    ResNetForImageClassification(config).save_pretrained(root / "clf")
    processor.save_pretrained(root / "clf")
    return root, save_tiny_pixel_unet(root / "unet")

@pytest.mark.slow
def test_runner_scores_both_generative_detectors(tiny_eval_data, tmp_path):
    root, unet = tiny_eval_data
    diffguard_params = dict(unet_id=str(unet), steps=10, max_inversion_steps=9, early_stop_psnr=15.0,
                            early_stop_similarity=None, distance="ssim", n_crops=2, batch_size=4)
    config = {"model": str(root / "clf"), "id": str(root / "id"), "ood": [{"manifest": str(root / "ood")}],
              "out": str(tmp_path / "run"), "batch_size": 8,
              "detectors": [{"name": "diffguard", "params": diffguard_params},
                            {"name": "opengan", "params": {"epochs": 2}}]}
    results = run_config(config)
    assert set(results["method"]) == {"diffguard", "opengan"}
    assert set(results["family"]) == {"generative"}
    assert results[["auroc", "fpr95"]].notna().all().all()
    scores = pd.read_parquet(tmp_path / "run" / "scores.parquet")
    ours = scores[scores.method == "diffguard"]

    # independent: the same detector scored directly on the test manifests gives the runner's scores
    from pipelines.classifier import ImageClassifier

    det = detectors.build("diffguard", classifier=ImageClassifier.from_pretrained(root / "clf"), **diffguard_params)
    id_test = ImageSet.from_manifest(read_manifest(root / "id"), split="test", role="id")
    direct = det.score(id_test)
    np.testing.assert_allclose(np.sort(ours[ours.role == "id"]["score"].to_numpy()), np.sort(direct), atol=1e-5)
    assert len(scores[(scores.method == "opengan") & (scores.role == "ood")]) == 5
