"""scripts/feature_map.py with a tiny random classifier and a tiny CLIP on three colour-coded image sets: seeded
samples, one PNG and CSV per model, points that keep their set (k-NN purity in 2-D) and cached features reused."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pipelines.data import make_row, write_manifest

ROOT = Path(__file__).resolve().parents[4]
COLOURS = {"ID": (220, 40, 40), "blue": (40, 40, 220), "green": (40, 200, 60)}


def _sets(root: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    rows = {"id": [], "ood": []}
    for name, colour in COLOURS.items():
        for i in range(30):
            pixels = np.clip(np.array(colour) + rng.normal(0, 25, (32, 32, 3)), 0, 255).astype(np.uint8)
            folder = "id" if name == "ID" else "ood"
            file = f"{name}_{i}.png"
            (root / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / folder / file)
            rows[folder].append(make_row(file, split="test", role="id", label=0) if name == "ID" else
                                make_row(file, split="test", role="ood", ood_set=name))
    write_manifest(root / "id", rows["id"])
    write_manifest(root / "ood", rows["ood"])
    return root / "id", root / "ood"


def _models(root: Path) -> tuple[Path, Path]:
    import torch
    from transformers import ResNetForImageClassification

    from pipelines.tiny import save_tiny_clip
    from pipelines.toydata import tiny_digit_classifier_config

    torch.manual_seed(0)
    config, processor = tiny_digit_classifier_config(num_labels=3)
    ResNetForImageClassification(config).save_pretrained(root / "clf")
    processor.save_pretrained(root / "clf")
    return root / "clf", save_tiny_clip(root / "clip")


def _cli():
    module = importlib.import_module("oodforge.commands.feature_map")
    return module


def _purity(points: pd.DataFrame, k: int = 5) -> float:
    """Share of each point's k nearest 2-D neighbours from its own set."""
    xy = points[["x", "y"]].to_numpy()
    d = ((xy[:, None] - xy[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    near = np.argsort(d, axis=1)[:, :k]
    labels = points["set"].to_numpy()
    return float((labels[near] == labels[:, None]).mean())


@pytest.fixture(autouse=True)
def one_openmp_thread():
    """t-SNE's OpenMP threads spin-wait on a shared CI machine (60 points: 30 s instead of 0.7 s); one thread here."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="openmp"):
        yield


@pytest.mark.slow
def test_feature_map_with_tiny_models(tmp_path):
    id_dir, ood_dir = _sets(tmp_path / "data")
    clf, clip = _models(tmp_path)
    cli = _cli()
    args = ["--id", str(id_dir), "--ood", str(ood_dir), "--model", str(clf), "--clip", str(clip), "--images", "20",
            "--perplexity", "10", "--out", str(tmp_path / "out"), "--device", "cpu"]
    assert cli.main(args) == 0
    out = tmp_path / "out"
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["feature_map_classifier_clf.png", "feature_map_clip_clip.png"]
    for name in pngs:
        with Image.open(out / name) as image:
            assert image.width > 400 and image.height > 300
    points = pd.read_csv(out / "feature_map_classifier_clf.csv")
    assert points["set"].value_counts().to_dict() == {"ID": 20, "blue": 20, "green": 20}
    assert all(f.startswith(s) for s, f in zip(points["set"], points["file_name"]))  # each point keeps its image
    assert _purity(points) > 0.9  # colour-coded sets stay apart: points are not shuffled between sets
    caches = {p: p.stat().st_mtime_ns for p in (out / "cache").rglob("*.safetensors")}
    assert len(caches) == 6  # one per (model, set)
    assert cli.main(args) == 0  # the same sample again: every cached feature file is reused, none rewritten
    assert {p: p.stat().st_mtime_ns for p in (out / "cache").rglob("*.safetensors")} == caches
    again = pd.read_csv(out / "feature_map_classifier_clf.csv")
    assert list(again["file_name"]) == list(points["file_name"])
    assert cli.main([*args[:-4], "--seed", "1", "--out", str(tmp_path / "out1"), "--device", "cpu"]) == 0
    other = pd.read_csv(tmp_path / "out1" / "feature_map_classifier_clf.csv")
    assert set(other["file_name"]) != set(points["file_name"])  # the seed decides the sample


def test_feature_map_input_errors(tmp_path):
    id_dir, ood_dir = _sets(tmp_path / "data")
    cli = _cli()
    from pipelines.errors import UserInputError

    with pytest.raises(UserInputError, match="--model"):
        cli.main(["--id", str(id_dir), "--ood", str(ood_dir), "--out", str(tmp_path / "o")])
    with pytest.raises(UserInputError, match="split 'val'"):
        cli.main(["--id", str(id_dir), "--split", "val", "--model", "x", "--out", str(tmp_path / "o")])


def test_feature_map_checks_before_work_and_a_failing_model_does_not_stop_the_others(tmp_path, capsys, monkeypatch):
    from pipelines.cli import run_main

    id_dir, ood_dir = _sets(tmp_path / "data")
    clf, _ = _models(tmp_path)
    main = _cli().main
    capsys.readouterr()
    base = ["--id", str(id_dir), "--ood", str(ood_dir), "--images", "8", "--perplexity", "3", "--device", "cpu"]
    out = tmp_path / "out"
    for extra, message in ((["--model", str(tmp_path / "no-such-clf")], "--model: the local model folder"),
                           (["--model", str(clf), "--embedding", "umap"],
                            "--embedding umap: not installed (pip install umap-learn)")):
        if "umap" in extra:  # whether or not umap is installed here
            real = importlib.util.find_spec
            monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, real=real: None if name == "umap"
                                else real(name, *a))
        assert run_main(main, [*base, *extra, "--out", str(out)]) == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith("error: ") and message in line and "\n" not in line, line
        assert not out.exists()  # refused before any work
        monkeypatch.undo()
    assert run_main(main, [*base, "--model", str(clf), "--clip", "oodforge-tests/no-such-clip", "--out", str(out),
                           "--dry-run"]) == 0
    assert "dry run: every check passed" in capsys.readouterr().out and not out.exists()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert run_main(main, [*base, "--clip", "oodforge-tests/no-such-clip", "--model", str(clf), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "clip oodforge-tests/no-such-clip failed" in err and err.strip().splitlines()[-1].startswith("error: 1 of 2")
    assert (out / "feature_map_classifier_clf.png").is_file()  # the model after the failing one still ran


def test_feature_map_figure_one_style_per_set():
    import pandas as pd

    from detectors.harness.report.feature_map import feature_map_figure
    from detectors.harness.report.figures import overlapping_ticks

    rng = np.random.default_rng(0)
    sets = ["ID", "transferred_bronze", "container", "transferred_container", "sketch_rubbing"]
    points = pd.DataFrame({"set": np.repeat(sets, 20), "x": rng.normal(size=100), "y": rng.normal(size=100)})
    figure = feature_map_figure(points, "t-SNE")
    assert len(figure.axes) == 1 and overlapping_ticks(figure) == []
    collections = figure.axes[0].collections
    assert len(collections) == 5 and all(len(c.get_offsets()) == 20 for c in collections)
    colours = {tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in collections}
    assert len(colours) == 5
    assert [t.get_text() for t in figure.axes[0].get_legend().get_texts()][0] == "ID (n=20)"
