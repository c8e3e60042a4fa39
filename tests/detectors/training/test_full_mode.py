"""Full fine-tuning (mode "full", the default) on a tiny transformers ResNet-50 stand-in and a few generated images:
the methods that were indistinguishable as heads on frozen features differ once the backbone trains; per-epoch
checkpoints resume a killed run; the fine-tuned model's features are re-extracted into a content-keyed cache."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.numpy import load_file

from detectors import FeatureSet, ImageSet, build, load
from pipelines.checkpoints import read_metadata
from pipelines.classifier import ImageClassifier
from pipelines.data import Manifest, make_row, write_manifest
from pipelines.tiny import RESNET_ID, save_tiny_model

COLOURS = [(220, 40, 40), (40, 200, 40), (40, 40, 220)]
FAST = dict(epochs=1, batch_size=8, lr=1e-2, warmup_epochs=0)


def _image(colour, rng) -> Image.Image:
    pixels = np.array(colour, np.float32)[None, None] + rng.normal(0, 25, (32, 32, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """3 ID classes (8 train, 3 test images each) and two different auxiliary sets (2 species each)."""
    root = tmp_path_factory.mktemp("full_mode")
    rng = np.random.default_rng(0)
    rows = []
    for label, colour in enumerate(COLOURS):
        for i in range(11):
            name = f"id_{label}_{i}.png"
            _image(colour, rng).save(root / name)
            rows.append(make_row(name, split="train" if i < 8 else "test", label=label))
    aux_sets = {}
    for which, colours in (("a", [(200, 200, 40), (200, 40, 200)]), ("b", [(20, 20, 20), (240, 240, 240)])):
        aux_rows = []
        for species, colour in enumerate(colours):
            for i in range(6):
                name = f"aux_{which}_{species}_{i}.png"
                _image(colour, rng).save(root / name)
                aux_rows.append(make_row(name, split="train", role="ood", ood_set="auxiliary", aux_label=species))
        aux_sets[which] = Manifest(root, aux_rows)
    manifest = write_manifest(root, rows)
    return manifest.select(split="train"), manifest.select(split="test"), aux_sets, _three_class_model(root)


def _three_class_model(root):
    """The tiny ResNet-50 stand-in with a 3-class head, saved once (every load then starts from the same weights)."""
    torch.manual_seed(0)
    clf = ImageClassifier.from_pretrained(save_tiny_model(root / "hub", RESNET_ID), num_labels=3,
                                          id2label={0: "a", 1: "b", 2: "c"},
                                          label2id={"a": 0, "b": 1, "c": 2}, ignore_mismatched_sizes=True)
    return clf.save_pretrained(root / "model")


def _classifier(model) -> ImageClassifier:
    return ImageClassifier.from_pretrained(model)


def _scores(name, data, aux="a", **params) -> np.ndarray:
    train, test, aux_sets, model = data
    det = build(name, classifier=_classifier(model), **FAST, **params).fit(ImageSet(manifest=train),
                                                                           aux=ImageSet(manifest=aux_sets[aux]))
    return det.score(ImageSet(manifest=test))


def test_full_mode_separates_what_heads_only_training_merged(data):
    """Full fine-tuning separates what heads on frozen features merge: NovelBranch from Extended, NovelBranch on two
    auxiliary sets, UDG from OE."""
    novel_a, extended, novel_b = (_scores("novel_branch", data), _scores("extended", data),
                                  _scores("novel_branch", data, "b"))
    assert np.abs(novel_a - extended).max() > 1e-4
    assert np.abs(novel_a - novel_b).max() > 1e-4
    udg = _scores("udg", data, num_clusters=4, pca_dim=8)
    oe = _scores("oe", data)
    assert np.abs(udg - oe).max() > 1e-4


def test_mode_sets_inputs_and_is_checked(data):
    assert build("oe").params["mode"] == "full" and build("oe").inputs == frozenset({"images"})
    assert build("oe", mode="heads").inputs == frozenset({"features", "logits"})
    assert build("rotpred").params["batch_size"] == 256 and build("oe").params["batch_size"] == 512
    with pytest.raises(ValueError, match="mode"):
        build("oe", mode="frozen")
    with pytest.raises(TypeError, match="heads"):
        build("logitnorm", classifier=_classifier(data[3])).fit(FeatureSet(np.zeros((4, 3)), None,
                                                                           np.array([0, 1, 2, 0])))


def test_transform_reextracts_with_the_finetuned_model_into_a_keyed_cache(data, tmp_path):
    train, test, aux_sets, model = data
    clf = _classifier(model)
    det = build("logitnorm", classifier=clf, work_dir=tmp_path, **FAST).fit(ImageSet(manifest=train))
    seen = det.transform(ImageSet(manifest=test))
    clf.eval()
    with torch.no_grad():
        z, h = clf(clf.preprocess([Image.open(test.path(r)).convert("RGB") for r in test.rows]))
    np.testing.assert_allclose(seen.features, h.double().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(seen.logits, z.double().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(seen.labels, test.labels())
    assert np.isclose(det.trained_head.weight, clf.head.weight.detach().double().numpy()).all()
    caches = sorted((tmp_path / "features").glob("*.safetensors"))
    assert len(caches) == 1
    # the trained detector is an artifact: fit wrote work_dir/model (config, heads, the fine-tuned classifier's
    # folder), which loads back with no classifier given (a given one is replaced) and scores the same
    artifact = tmp_path / "model"
    assert (artifact / "config.json").is_file() and (artifact / "classifier" / "model.safetensors").is_file()
    assert not [k for k in load_file(str(artifact / "model.safetensors")) if k.startswith("classifier.")]
    for loaded in (load(artifact), load(artifact, classifier=_classifier(model))):
        np.testing.assert_allclose(loaded.score(ImageSet(manifest=test)), det.score(ImageSet(manifest=test)), rtol=1e-6)
    # the fine-tuned classifier is a model folder of its own: `model:` of an eval config can name it
    reloaded = ImageClassifier.from_pretrained(artifact / "classifier")
    for a, b in zip(reloaded.state_dict().values(), clf.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_plain_module_classifier_is_saved_as_arrays(data, tmp_path):
    """A classifier that is not a transformers model has no model folder: its weights go into model.safetensors and
    loading needs a classifier of the same architecture."""
    train, test, _, model = data
    hf = _classifier(model)
    plain = ImageClassifier.from_module(_Plain(hf), image_size=hf.image_size, head=hf.head)
    det = build("logitnorm", classifier=plain, **FAST).fit(ImageSet(manifest=train))
    folder = det.save_pretrained(tmp_path / "saved")
    assert not (folder / "classifier").exists()
    assert any(k.startswith("classifier.") for k in load_file(str(folder / "model.safetensors")))
    fresh = _classifier(model)
    loaded = load(folder,
                  classifier=ImageClassifier.from_module(_Plain(fresh), image_size=fresh.image_size, head=fresh.head))
    np.testing.assert_allclose(loaded.score(ImageSet(manifest=test)), det.score(ImageSet(manifest=test)), rtol=1e-6)
    with pytest.raises(ValueError, match="classifier"):
        load(folder)


class _Plain(torch.nn.Module):
    """A transformers classifier behind a plain `(logits, features)` forward."""

    def __init__(self, hf: ImageClassifier):
        super().__init__()
        self.inner, self.head = hf, hf.head

    def forward(self, x):
        return self.inner(x)


def test_killed_run_resumes_from_its_last_epoch(data, tmp_path, monkeypatch):
    """Kill after the first epoch's checkpoint; the rerun trains the second epoch only and ends with the weights of an
    uninterrupted run."""
    import pipelines.training.loop as training  # the loop module holds save_checkpoint and _all_outputs

    train, _, aux_sets, model = data
    params = dict(epochs=2, batch_size=8, lr=1e-2, warmup_epochs=1)
    whole = build("energy_oe", classifier=_classifier(model), work_dir=tmp_path / "whole", **params)
    whole.fit(ImageSet(manifest=train), aux=ImageSet(manifest=aux_sets["a"]))

    real_save = training.save_checkpoint

    def save_then_die(path, key, epoch, *rest):
        real_save(path, key, epoch, *rest)
        if epoch == 1:
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(training, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        build("energy_oe", classifier=_classifier(model), work_dir=tmp_path / "run", **params).fit(
            ImageSet(manifest=train), aux=ImageSet(manifest=aux_sets["a"]))
    monkeypatch.setattr(training, "save_checkpoint", real_save)
    monkeypatch.setattr(training, "_all_outputs", lambda *a, **k: pytest.fail("calibration must not rerun on resume"))
    resumed = build("energy_oe", classifier=_classifier(model), work_dir=tmp_path / "run", **params)
    resumed.fit(ImageSet(manifest=train), aux=ImageSet(manifest=aux_sets["a"]))
    assert [h["epoch"] for h in resumed.history] == [1, 2]
    for a, b in zip(whole.classifier.state_dict().values(), resumed.classifier.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # another starting model is another run: the checkpoint is not resumed (calibration runs, a new key is written)
    monkeypatch.undo()
    key = read_metadata(tmp_path / "run" / "finetune.safetensors")["key"]
    other = _classifier(model)
    with torch.no_grad():
        other.head.bias.add_(1.0)
    build("energy_oe", classifier=other, work_dir=tmp_path / "run", **params).fit(
        ImageSet(manifest=train), aux=ImageSet(manifest=aux_sets["a"]))
    assert read_metadata(tmp_path / "run" / "finetune.safetensors")["key"] != key
