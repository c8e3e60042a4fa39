"""MDSEns against a float64 numpy computation: a classifier whose only map is a convolution, so the pooled feature
is linear in the input and the input pre-processing step can be worked out by hand."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from detectors import ImageSet, build
from detectors.base import Detector


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.pool, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Linear(4, 2)

    def forward(self, x):
        h = self.pool(self.conv(x)).flatten(1)
        return self.fc(h), h


def _pooled_conv(x, w, b):
    """numpy float64: the channel means of a valid 3x3 convolution, [N, 4]."""
    n, _, size, _ = x.shape
    out = size - 2
    acc = np.zeros((n, w.shape[0]))
    for i in range(3):
        for j in range(3):
            acc += np.einsum("nchw,oc->no", x[:, :, i:i + out, j:j + out], w[:, :, i, j]) / out ** 2
    return acc + b


def test_mdsens_by_hand(tmp_path):
    from PIL import Image

    from pipelines.classifier import ImageClassifier

    torch.manual_seed(0)
    clf = ImageClassifier.from_module(ConvNet(), image_size=6)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (6, 6, 3)).astype(np.uint8)) for _ in range(16)]
    labels = np.repeat([0, 1], 8)
    noise = 0.01
    det = build("mdsens", classifier=clf, maps="relu_conv", noise=noise).fit(ImageSet(images=images, labels=labels))
    test = [Image.fromarray(rng.integers(0, 255, (6, 6, 3)).astype(np.uint8)) for _ in range(5)]

    w, b = clf.model.conv.weight.detach().double().numpy(), clf.model.conv.bias.detach().double().numpy()
    x_train = clf.preprocess(images).double().numpy()
    f = _pooled_conv(x_train, w, b)
    means = np.stack([f[labels == c].mean(0) for c in (0, 1)])
    centred = f - means[labels]
    precision = np.linalg.inv(centred.T @ centred / len(f))
    x = clf.preprocess(test).double().numpy()
    g = _pooled_conv(x, w, b)
    diff = g[:, None, :] - means[None]
    closest = np.einsum("nkf,fg,nkg->nk", diff, precision, diff).argmin(1)
    # f is linear in x: d f / d x by unit inputs, then the gradient of mean_n 0.5 d^2 (its sign is what counts)
    basis = np.eye(x[0].size).reshape(-1, *x.shape[1:])
    jac = (_pooled_conv(basis, w, b) - b).T  # [4, 108]
    grad = (g - means[closest]) @ precision @ jac
    moved = x - noise * np.where(grad >= 0, 1.0, -1.0).reshape(x.shape) / 0.5
    h = _pooled_conv(moved, w, b)
    diff = h[:, None, :] - means[None]
    want = (-0.5 * np.einsum("nkf,fg,nkg->nk", diff, precision, diff)).max(1)
    got = det.score(ImageSet(images=test))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    loaded = Detector.from_pretrained(det.save_pretrained(tmp_path / "mdsens"), classifier=clf, maps="relu_conv")
    np.testing.assert_allclose(loaded.score(ImageSet(images=test)), got, rtol=1e-12)


def test_mdsens_layers_alpha_fit_on_validation_and_errors(tmp_path):
    from PIL import Image

    from pipelines.classifier import ImageClassifier
    from pipelines.tiny import RESNET_ID, save_tiny_model

    clf = ImageClassifier.from_pretrained(save_tiny_model(tmp_path / "m", RESNET_ID))
    rng = np.random.default_rng(1)

    def images(n, shift):
        return ([Image.fromarray(np.clip(rng.normal(128 + shift, 30, (32, 32, 3)), 0, 255).astype(np.uint8))
                 for _ in range(n)])

    train = ImageSet(images=images(24, 0), labels=np.repeat([0, 1, 2], 8))
    layers = [0, 1, 2, 3, 4]
    det = build("mdsens", classifier=clf, layers=layers, feature_types=["mean", "stat", "stat", "mean", "mean"],
                alpha="fit")
    det.fit(train, id_val=ImageSet(images=images(10, 0)), ood_val=ImageSet(images=images(10, 60)))
    assert det.alpha.shape == (5,)
    test = ImageSet(images=images(4, 30))
    np.testing.assert_allclose(det.score(test), det.layer_scores(test) @ det.alpha, rtol=1e-12)
    with pytest.raises(ValueError, match="alpha"):
        build("mdsens", layers=[0, 1], feature_types=["mean", "mean"], alpha=[1.0])
    with pytest.raises(ValueError, match="ood_val"):
        build("mdsens", classifier=clf, alpha="fit").fit(train)


class WideConvNet(ConvNet):
    """ConvNet with 24 channels: with 16 training images of 2 classes the tied covariance is singular (D > N - C)."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 24, 3), torch.nn.Linear(24, 2)


def test_mdsens_singular_covariance_is_sklearns_pinvh():
    from PIL import Image
    from sklearn.covariance import EmpiricalCovariance

    from pipelines.classifier import ImageClassifier

    torch.manual_seed(0)
    clf = ImageClassifier.from_module(WideConvNet(), image_size=6)
    rng = np.random.default_rng(2)
    images = [Image.fromarray(rng.integers(0, 255, (6, 6, 3)).astype(np.uint8)) for _ in range(16)]
    labels = np.repeat([0, 1], 8)
    det = build("mdsens", classifier=clf, maps="relu_conv").fit(ImageSet(images=images, labels=labels))
    w, b = clf.model.conv.weight.detach().double().numpy(), clf.model.conv.bias.detach().double().numpy()
    f = _pooled_conv(clf.preprocess(images).double().numpy(), w, b)
    means = np.stack([f[labels == c].mean(0) for c in (0, 1)])
    oracle = EmpiricalCovariance(assume_centered=False).fit(f - means[labels]).precision_
    got_means, got_precision = det.stats[0]
    assert np.linalg.matrix_rank(oracle) == 14  # N - C
    np.testing.assert_allclose(got_means, means, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_precision, oracle, rtol=1e-3, atol=1e-3 * np.abs(oracle).max())
    scores = det.score(ImageSet(images=[Image.fromarray(rng.integers(0, 255, (6, 6, 3)).astype(np.uint8))
                                        for _ in range(6)]))
    assert np.isfinite(scores).all() and np.unique(scores).size == scores.size
