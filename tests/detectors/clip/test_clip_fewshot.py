"""Few-shot sweep over a manifest (rows, metrics, ID accuracy, saved detectors, plot) and the demo stage."""
from __future__ import annotations

import numpy as np
from helpers.images import CLASSES, colour_images

from detectors.base import Detector, ImageSet
from detectors.harness.clip_demo import clip_demo
from detectors.harness.fewshot import plot_fewshot, sweep
from detectors.metrics import evaluate
from pipelines.data import make_row, read_manifest, write_manifest


def write_toy_manifest(folder):
    rows = []
    spec = [("train", "id", 0, [0], 3), ("train", "id", 1, [1], 3), ("test", "id", 0, [0], 3),
            ("test", "id", 1, [1], 3), ("test", "ood", -1, [0, 1], 4), ("test", "ood", -1, [2], 4)]
    for k, (split, role, label, channels, n) in enumerate(spec):
        for i, image in enumerate(colour_images(channels, n, seed=k)):
            name = f"{split}_{role}_{k}_{i}.png"
            image.save(folder / name)
            ood_set = None if role == "id" else ("yellow" if channels == [0, 1] else "blue")
            rows.append(make_row(name, split=split, role=role, label=label, ood_set=ood_set,
                                 group="hard" if ood_set else None))
    write_manifest(folder, rows)


def test_sweep_rows_match_an_independent_evaluation_and_plot(tiny_clip_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_toy_manifest(data)
    config = {"model": str(tiny_clip_dir), "manifest": str(data), "class_names": CLASSES, "shots": [1, 2], "seeds": [1],
              "methods": {"locoop": {"epochs": 2, "progress": False},
                          "idlike": {"epochs": 1, "n_crops": 4, "n_select": 1, "n_ood_prompts": 2, "progress": False}},
              "out_dir": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache")}
    rows = sweep(config)
    assert len(rows) == 2 * 2 * 2  # methods x shots x OOD sets
    assert {r["ood_set"] for r in rows} == {"yellow", "blue"} and all(r["group"] == "hard" for r in rows)
    row = next(r for r in rows if r["method"] == "locoop" and r["shots"] == 2 and r["ood_set"] == "blue")
    det = Detector.from_pretrained(tmp_path / "out" / "locoop-2shot-seed1", model=str(tiny_clip_dir))
    manifest = read_manifest(data)
    id_test = ImageSet.from_manifest(manifest, split="test", role="id")
    blue = ImageSet.from_manifest(manifest, split="test", ood_set="blue")
    expected = evaluate(det.score(id_test), det.score(blue))
    np.testing.assert_allclose(row["auroc"], 100 * expected["auroc"])
    np.testing.assert_allclose(row["fpr95"], 100 * expected["fpr95"])
    np.testing.assert_allclose(row["id_acc"], 100 * np.mean(det.predict(id_test) == id_test.labels))
    assert (tmp_path / "out" / "fewshot.csv").is_file()
    png = plot_fewshot(rows, str(tmp_path / "fewshot.png"))
    assert png.stat().st_size > 1000


def test_clip_demo_rows(tmp_path):
    ids = colour_images([0], 3, 0) + colour_images([1], 3, 1)
    rows = clip_demo(str(tmp_path), ids, [0, 0, 0, 1, 1, 1], CLASSES, {"yellow": colour_images([0, 1], 4, 2)},
                     locoop_epochs=2)
    assert [(r["method"], r["ood_set"]) for r in rows] == [("mcm", "yellow"), ("locoop", "yellow")]
    assert all(0 <= r["auroc"] <= 100 and r["n_id"] == 6 and r["n_ood"] == 4 for r in rows)
    assert (tmp_path / "locoop" / "model.safetensors").is_file()


def test_train_prompt_detectors_writes_one_loadable_folder_per_run(tiny_clip_dir, tmp_path):
    from detectors.clip.fewshot import train_prompt_detectors

    data = tmp_path / "data"
    data.mkdir()
    write_toy_manifest(data)
    (data / "classes.txt").write_text("red\ngreen\n")
    config = {"model": str(tiny_clip_dir), "manifest": str(data), "class_names_file": str(data / "classes.txt"),
              "methods": {"locoop": {"epochs": 1, "progress": False}}, "shots": [1], "seeds": [1, 2],
              "out_dir": str(tmp_path / "runs")}
    folders = train_prompt_detectors(config)
    assert [f.name for f in folders] == ["locoop-1shot-seed1", "locoop-1shot-seed2"]
    a, b = (Detector.from_pretrained(f, model=str(tiny_clip_dir)) for f in folders)
    assert a.params["class_names"] == CLASSES and a.params["seed"] == 1 and b.params["seed"] == 2
    assert not np.array_equal(a.state()["prompt.ctx"], b.state()["prompt.ctx"])  # seeds differ


def test_sweep_embeds_the_training_set_once_and_matches_the_per_subset_path(tiny_clip_dir, tmp_path):
    """Few-shot runs slice one cached pass over the union of their subsets; results equal training on each subset."""
    import detectors
    from detectors.clip.backbone import ClipBackbone
    from detectors.clip.common import few_shot_indices
    from detectors.clip.features import subset_imageset
    from detectors.harness.fewshot import sweep_sets

    backbone = ClipBackbone.load(str(tiny_clip_dir), device="cpu")
    labels = np.array([0] * 5 + [1] * 5)
    train = ImageSet(images=colour_images([0], 5, 0) + colour_images([1], 5, 1), labels=labels)
    id_test = ImageSet(images=colour_images([0], 2, 2) + colour_images([1], 2, 3), labels=np.array([0, 0, 1, 1]))
    ood = {"yellow": ImageSet(images=colour_images([0, 1], 3, 4))}
    seen = []
    hook = backbone.model.vision_model.embeddings.register_forward_hook(lambda m, i, out: seen.append(out.shape[0]))
    config = {"model": backbone, "shots": [1, 2], "seeds": [1, 2],
              "methods": {"locoop": {"epochs": 2, "progress": False}}, "out_dir": str(tmp_path / "out")}
    try:
        from unittest import mock

        with mock.patch.object(ClipBackbone, "load", return_value=backbone):
            sweep_sets(config, train, id_test, ood, {"yellow": "hard"}, CLASSES)
    finally:
        hook.remove()
    union = set().union(*(few_shot_indices(labels, k, s) for k in (1, 2) for s in (1, 2)))
    assert len(union) < 2 * (1 + 2) * 2  # the subsets overlap: per-subset caching would embed more
    # image-tower passes: one over the union of the training subsets, one per test set; nothing per run
    assert seen == [len(union), len(id_test), len(ood["yellow"])]
    for shots in (1, 2):
        for seed in (1, 2):
            saved = Detector.from_pretrained(tmp_path / "out" / f"locoop-{shots}shot-seed{seed}", model=backbone)
            subset = subset_imageset(train, few_shot_indices(labels, shots, seed))
            alone = detectors.build("locoop", model=backbone, class_names=CLASSES, epochs=2, progress=False,
                                    shots=None, seed=seed).fit(subset)
            np.testing.assert_allclose(saved.state()["prompt.ctx"], alone.state()["prompt.ctx"], rtol=1e-5, atol=1e-6)
