"""Classifier wrapper and feature caches, on a tiny transformers ResNet saved and reloaded like a hub model."""
import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.classifier import ImageClassifier
from pipelines.data import make_row, write_manifest
from pipelines.features import FeatureCache, cache_path, extract_features
from pipelines.toydata import tiny_digit_classifier_config


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    from transformers import ResNetForImageClassification

    torch.manual_seed(0)
    config, processor = tiny_digit_classifier_config(num_labels=4)
    folder = tmp_path_factory.mktemp("clf")
    ResNetForImageClassification(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return ImageClassifier.from_pretrained(folder)


@pytest.fixture()
def manifest(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(7):
        Image.fromarray(rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append(make_row(f"{i}.png", split="test", label=i % 4))
    (tmp_path / "broken.png").write_bytes(b"not an image")
    rows.insert(3, make_row("broken.png", split="test", label=0))
    return write_manifest(tmp_path, rows)


def test_head_reproduces_logits(tiny_classifier):
    x = torch.randn(3, 3, 32, 32)
    logits, feats = tiny_classifier(x)
    assert feats.shape == (3, tiny_classifier.head.in_features)
    torch.testing.assert_close(feats @ tiny_classifier.head.weight.T + tiny_classifier.head.bias, logits)
    direct = tiny_classifier.model(pixel_values=x).logits
    torch.testing.assert_close(direct, logits)


def test_forward_images_matches_processor(tiny_classifier):
    img = Image.fromarray(np.random.default_rng(1).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    via_processor = tiny_classifier.preprocess([img])
    x01 = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).permute(2, 0, 1)[None]
    torch.testing.assert_close(tiny_classifier.normalize(x01), via_processor, atol=1e-5, rtol=0)


def test_extract_matches_manual_forward_and_records_failures(tiny_classifier, manifest, tmp_path):
    path = cache_path(tmp_path / "cache", "test", "k1")
    cache = extract_features(tiny_classifier, manifest, batch_size=3, cache=path)
    assert list(cache.index) == [0, 1, 2, 4, 5, 6, 7]
    assert [f["file"] for f in cache.failures] == ["broken.png"]
    good = [manifest.rows[i] for i in cache.index]
    with torch.no_grad():
        logits, feats = tiny_classifier(tiny_classifier.preprocess(
            [Image.open(manifest.root / r["file_name"]).convert("RGB") for r in good]))
    np.testing.assert_allclose(cache.features, feats.numpy(), atol=1e-5)
    np.testing.assert_allclose(cache.logits, logits.numpy(), atol=1e-5)
    np.testing.assert_array_equal(cache.labels, [r["label"] for r in good])
    np.testing.assert_allclose(cache.head()(cache.features.astype(np.float64)), cache.logits, atol=1e-4)

    loaded = FeatureCache.load(path)
    np.testing.assert_array_equal(loaded.features, cache.features)
    assert loaded.metadata["manifest"] == manifest.fingerprint() and loaded.failures == cache.failures


def test_cache_is_reused(tiny_classifier, manifest, tmp_path, monkeypatch):
    path = tmp_path / "c.safetensors"
    first = extract_features(tiny_classifier, manifest, cache=path)
    calls = []
    monkeypatch.setattr(type(tiny_classifier), "forward", lambda *a, **k: calls.append(1))
    second = extract_features(tiny_classifier, manifest, cache=path)
    assert not calls
    np.testing.assert_array_equal(first.logits, second.logits)
