"""GRAM vs a float64 hand computation in OpenOOD v1.5's form (full Gram matrices, per-class loops), on a tiny
transformers ResNet (hidden states) and a plain module (ReLU / Conv2d hooks); the feature cache; the holdout split."""
import numpy as np
import pytest
import torch
from helpers.models import tiny_resnet_classifier
from PIL import Image
from torch import nn

import detectors
from detectors import ImageSet
from detectors.posthoc import gram as gram_module
from detectors.posthoc.gram import holdout_split
from pipelines.classifier import ImageClassifier
from pipelines.data import make_row, read_manifest, write_manifest

POWERS = [1, 2, 3]


def _hf_classifier(folder, seed=0, classes=3):
    return tiny_resnet_classifier(folder, classes, seed)


def _images(n, seed):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)) for _ in range(n)]


def _reference_maps(clf, images, layers):
    """float64 logits and feature maps of each image, one image at a time (no batching)."""
    model = clf.model.double()
    out_logits, out_maps = [], []
    try:
        for image in images:
            x = clf.preprocess([image]).double()
            if layers == "hidden_states":
                out = model(pixel_values=x, output_hidden_states=True)
                out_logits.append(out.logits[0].detach().numpy())
                out_maps.append([h[0].detach().numpy() for h in out.hidden_states])
            else:
                maps = []
                hooks = [m.register_forward_hook(lambda m, a, o, maps=maps: maps.append(o[0].detach().numpy()))
                         for m in model.modules() if isinstance(m, (nn.ReLU, nn.Conv2d))]
                out_logits.append(model(x)[0][0].detach().numpy())
                for h in hooks:
                    h.remove()
                out_maps.append(maps)
    finally:
        model.float()
    return np.array(out_logits), out_maps


def _reference_gram(fmap, p):
    """OpenOOD's G_p on one map: full Gram matrix of (map^p) [C, positions], row sums, signed p-th root."""
    t = fmap.reshape(fmap.shape[0], -1) ** p
    rows = (t @ t.T).sum(axis=1)
    return np.sign(rows) * np.abs(rows) ** (1.0 / p)


def _reference_gram_score(clf, train, train_labels, test, layers, held):
    logits_tr, maps_tr = _reference_maps(clf, train, layers)
    logits_te, maps_te = _reference_maps(clf, test, layers)
    n_layers = len(maps_tr[0])
    g_tr = [[[_reference_gram(m[l], p) for p in POWERS] for l in range(n_layers)] for m in maps_tr]
    g_te = [[[_reference_gram(m[l], p) for p in POWERS] for l in range(n_layers)] for m in maps_te]
    classes = logits_tr.shape[1]
    fit = [i for i in range(len(train)) if i not in set(held)]
    bounds = {}
    for c in range(classes):
        rows = [i for i in fit if train_labels[i] == c]
        for l in range(n_layers):
            for k in range(len(POWERS)):
                stack = np.array([g_tr[i][l][k] for i in rows])
                bounds[c, l, k] = stack.min(axis=0), stack.max(axis=0)

    def delta(c, l, k, x):
        lo, hi = bounds[c, l, k]
        return float(np.sum(np.maximum(lo - x, 0) / np.abs(lo + 1e-6))
                     + np.sum(np.maximum(x - hi, 0) / np.abs(hi + 1e-6)))

    norm = [np.mean([sum(delta(train_labels[i], l, k, g_tr[i][l][k]) for k in range(len(POWERS))) for i in held])
            for l in range(n_layers)]
    scores = []
    for i in range(len(test)):
        z = logits_te[i]
        pred = int(np.argmax(z))
        conf = np.max(np.exp(z - z.max()) / np.exp(z - z.max()).sum())
        dev = sum(delta(pred, l, k, g_te[i][l][k]) / norm[l] for l in range(n_layers) for k in range(len(POWERS)))
        scores.append(-dev / conf)
    return np.array(scores)


def test_gram_matches_float64_reference_on_hidden_states(tmp_path, single_torch_thread):
    clf = _hf_classifier(tmp_path / "clf")
    train, test = _images(24, seed=1), _images(6, seed=2) + [Image.new("RGB", (16, 16), (250, 0, 250))]
    labels = np.arange(24) % 3
    det = detectors.build("gram", classifier=clf, batch_size=5, powers=POWERS, holdout=0.25)
    det.fit(ImageSet(images=train, labels=labels))
    held = holdout_split(labels, 0.25, 0)[1]
    expected = _reference_gram_score(clf, train, labels, test, "hidden_states", held)
    assert len(det.normalizers) == 3  # embedder + 2 stages
    np.testing.assert_allclose(det.score(ImageSet(images=test)), expected, rtol=1e-4)
    assert np.all(expected < 0)  # these test images leave the training ranges somewhere


class ConvNet(nn.Module):
    """conv -> relu -> conv -> relu (the same ReLU module twice) -> pool -> linear."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 5, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(5, classes)

    def forward(self, x):
        h = self.relu(self.conv2(self.relu(self.conv1(x)))).mean(dim=(2, 3))
        return self.fc(h), h


def test_gram_relu_conv_hooks_match_float64_reference(single_torch_thread):
    torch.manual_seed(3)
    clf = ImageClassifier.from_module(ConvNet(), image_size=16, mean=(0.5,) * 3, std=(0.5,) * 3)
    train, test = _images(30, seed=4), _images(5, seed=5)
    labels = np.arange(30) % 3
    det = (detectors.build("gram", classifier=clf, layers="relu_conv", powers=POWERS)
           .fit(ImageSet(images=train, labels=labels)))
    assert len(det.normalizers) == 4  # conv1, relu, conv2, relu again
    held = holdout_split(labels, 0.1, 0)[1]
    expected = _reference_gram_score(clf, train, labels, test, "relu_conv", held)
    np.testing.assert_allclose(det.score(ImageSet(images=test)), expected, rtol=1e-4)


def test_gram_id_val_normalisation_uses_all_training_images(single_torch_thread):
    torch.manual_seed(3)
    clf = ImageClassifier.from_module(ConvNet(), image_size=16, mean=(0.5,) * 3, std=(0.5,) * 3)
    train, val = _images(12, seed=6), _images(6, seed=7)
    labels = np.arange(12) % 3
    det = detectors.build("gram", classifier=clf, layers="relu_conv", normalize="id_val")
    det.fit(ImageSet(images=train, labels=labels), id_val=ImageSet(images=val, labels=np.arange(6) % 3))
    gram = det.features(ImageSet(images=train, labels=labels)).gram
    np.testing.assert_allclose(det.mins[0], gram[labels == 0].min(axis=0))
    np.testing.assert_allclose(det.maxs[2], gram[labels == 2].max(axis=0))
    # the training images themselves lie inside their class's range: deviation only through a wrong prediction
    assert np.all(det.score(ImageSet(images=train, labels=labels))[
        det.features(ImageSet(images=train)).logits.argmax(1) == labels] == 0)


def test_holdout_split_takes_a_tenth_of_each_class():
    labels = np.repeat(np.arange(3), [20, 31, 9])
    fit, held = holdout_split(labels, 0.1, seed=1)
    assert np.bincount(labels[held], minlength=3).tolist() == [2, 3, 0]
    assert sorted(np.concatenate([fit, held]).tolist()) == list(range(60))


def test_gram_features_are_cached_per_model_and_image_set(tmp_path, monkeypatch, single_torch_thread):
    clf = _hf_classifier(tmp_path / "clf")
    folder = tmp_path / "data"
    folder.mkdir()
    rows = []
    for i, image in enumerate(_images(12, seed=8)):
        image.save(folder / f"{i}.png")
        rows.append(make_row(f"{i}.png", split="train", role="id", label=i % 3))
    write_manifest(folder, rows)
    images = ImageSet(manifest=read_manifest(folder))
    cache = tmp_path / "cache"
    first = detectors.build("gram", classifier=clf, cache_dir=cache, holdout=0.25).fit(images)
    assert len(list(cache.glob("gram-*.safetensors"))) == 1
    expected = first.score(ImageSet(manifest=read_manifest(folder)))

    def boom(*args, **kwargs):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(gram_module, "compute_gram_features", boom)
    again = (detectors.build("gram", classifier=clf, cache_dir=cache, holdout=0.25)
             .fit(ImageSet(manifest=read_manifest(folder))))
    np.testing.assert_array_equal(again.score(ImageSet(manifest=read_manifest(folder))), expected)
    monkeypatch.undo()
    with torch.no_grad():  # other weights, same id: a new cache file
        clf.head.bias.add_(1.0)
    detectors.build("gram", classifier=clf, cache_dir=cache, holdout=0.25).fit(ImageSet(manifest=read_manifest(folder)))
    assert len(list(cache.glob("gram-*.safetensors"))) == 2


def test_gram_rejects_bad_input(single_torch_thread):
    torch.manual_seed(3)
    clf = ImageClassifier.from_module(ConvNet(), image_size=16, mean=(0.5,) * 3, std=(0.5,) * 3)
    with pytest.raises(ValueError, match="powers"):
        detectors.build("gram", powers=[0, 1])
    with pytest.raises(ValueError, match="hidden_states"):
        detectors.build("gram", classifier=clf).fit(ImageSet(images=_images(3, 1), labels=np.arange(3)))
    with pytest.raises(ValueError, match="class 2"):
        detectors.build("gram", classifier=clf, layers="relu_conv").fit(ImageSet(images=_images(20, 1),
                                                                                 labels=np.arange(20) % 2))
    assert (detectors.detector_class("gram").accepts("classifier")
            and detectors.detector_class("gram").accepts("cache_dir"))
