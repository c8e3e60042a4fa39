"""scripts/make_tiny.py: each stand-in it writes loads through the code path users run with a real id or folder, and is
the stand-in the tests build (same weights for the same seed)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipelines.cli import run_main

ROOT = Path(__file__).resolve().parents[2]


def _make(argv: list[str]) -> int:
    module = importlib.import_module("oodforge.commands.make_tiny")
    return run_main(module.main, argv)


def _same_weights(a: Path, b: Path, name: str = "model.safetensors") -> bool:
    left, right = load_file(str(a / name)), load_file(str(b / name))
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def test_classifier_with_labels_loads_as_the_users_model(tmp_path, single_torch_thread, capsys):
    from PIL import Image

    from pipelines.classifier import ImageClassifier
    from pipelines.tiny import RESNET_ID, save_tiny_model

    assert _make(["classifier", "--out", str(tmp_path / "clf"), "--labels", "5"]) == 0
    assert "wrote classifier stand-in" in capsys.readouterr().out
    clf = ImageClassifier.from_pretrained(tmp_path / "clf")  # what `model:` in eval configs loads
    assert clf.class_names == [f"LABEL_{i}" for i in range(5)]
    with torch.no_grad():
        logits, features = clf.eval()(clf.preprocess([Image.new("RGB", (40, 30), (90, 20, 200))]))
    assert logits.shape == (1, 5) and features.ndim == 2
    assert _same_weights(tmp_path / "clf", save_tiny_model(tmp_path / "ref", RESNET_ID, labels=5))
    assert _make(["classifier", "--out", str(tmp_path / "plain")]) == 0
    assert _same_weights(tmp_path / "plain", save_tiny_model(tmp_path / "ref2", RESNET_ID))


def test_clip_loads_through_the_clip_backbone(tmp_path, single_torch_thread):
    from PIL import Image

    from detectors.clip.backbone import ClipBackbone
    from pipelines.tiny import save_tiny_clip

    assert _make(["clip", "--out", str(tmp_path / "clip")]) == 0
    backbone = ClipBackbone.load(str(tmp_path / "clip"), device="cpu")
    texts = backbone.encode_texts(["a photo of a cup.", "a photo of a bowl."])
    image, _ = backbone.image_embeddings(backbone.preprocess([Image.new("RGB", (32, 32))]), local=False)
    assert texts.shape[0] == 2 and image.shape[1] == texts.shape[1]
    assert _same_weights(tmp_path / "clip", save_tiny_clip(tmp_path / "ref"))


def test_diffguard_unet_loads_through_the_pixel_loader(tmp_path, single_torch_thread):
    from detectors.generative.guided_diffusion import load_pixel_unet
    from pipelines.tiny import save_tiny_pixel_unet

    assert _make(["diffguard-unet", "--out", str(tmp_path / "unet")]) == 0
    unet = load_pixel_unet(str(tmp_path / "unet"))
    assert unet.config.out_channels == 6 and unet.config.sample_size == 32
    name = "diffusion_pytorch_model.safetensors"
    assert _same_weights(tmp_path / "unet", save_tiny_pixel_unet(tmp_path / "ref"), name)


@pytest.mark.slow
def test_zest_loads_through_the_zest_pipeline_from_the_printed_overrides(tmp_path, single_torch_thread, capsys):
    from gen.zest import ZeSTConfig, ZeSTPipeline
    from pipelines.configfile import apply_overrides

    assert _make(["zest", "--out", str(tmp_path / "zest")]) == 0
    line = capsys.readouterr().out
    overrides = [w for w in line.split() if w.startswith("models.")]
    assert len(overrides) == 4
    models = apply_overrides({}, overrides)["models"]
    pipe = ZeSTPipeline.from_config(ZeSTConfig.from_dict(models), device="cpu", dtype=torch.float32)
    assert pipe is not None and Path(models["base"]) == tmp_path / "zest" / "sdxl"


def test_bad_arguments_are_one_line(tmp_path, capsys):
    assert _make(["clip", "--out", str(tmp_path / "x"), "--labels", "3"]) == 2
    err = capsys.readouterr().err
    assert "--labels takes a positive number and belongs to the classifier" in err and err.count("\n") == 1
