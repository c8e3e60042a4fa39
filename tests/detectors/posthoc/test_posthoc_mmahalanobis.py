"""MultiMahalanobis against pytorch-ood 0.4.0's `MultiMahalanobis` on a tiny two-convolution network (its fit on the
same layers' maps, its own `predict` on the images) and a float64 numpy replay, plus its edges."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.pytorch_ood import pytorch_ood_detector

from detectors import ImageSet, build
from detectors.base import Detector


class TwoConv(torch.nn.Module):
    def __init__(self, width: int = 5):
        super().__init__()
        self.conv1, self.relu1 = torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()
        self.conv2, self.relu2 = torch.nn.Conv2d(4, width, 3), torch.nn.ReLU()
        self.pool, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Linear(width, 3)

    def stages(self) -> list[torch.nn.Module]:
        return [self.conv1, self.relu1, self.conv2, self.relu2]  # the relu_conv maps, in call order

    def forward(self, x):
        h = self.pool(self.relu2(self.conv2(self.relu1(self.conv1(x))))).flatten(1)
        return self.fc(h), h


def _setup(width: int = 5, n: int = 24, classes: int = 3, seed: int = 0):
    from PIL import Image

    from pipelines.classifier import ImageClassifier

    torch.manual_seed(seed)
    clf = ImageClassifier.from_module(TwoConv(width), image_size=8)
    rng = np.random.default_rng(seed)

    def images(k, shift=0):
        return [Image.fromarray(np.clip(rng.normal(128 + shift, 40, (8, 8, 3)), 0, 255).astype(np.uint8))
                for _ in range(k)]

    return clf, images(n), np.arange(n) % classes, images(9, 25)


def _pooled(clf, images, dtype=torch.float64) -> list[np.ndarray]:
    """Each stage's output averaged over H, W, through the modules themselves."""
    x = clf.preprocess(images).to(dtype)
    out = []
    with torch.no_grad():
        for stage in clf.model.to(dtype).stages():
            x = stage(x)
            out.append(x.mean(dim=(2, 3)).numpy())
    clf.model.float()
    return out


def _float64(clf, train, labels, test, alpha, reg=1e-6) -> np.ndarray:
    total = 0.0
    for a, f, g in zip(alpha, _pooled(clf, train), _pooled(clf, test)):
        means = np.stack([f[labels == c].mean(0) for c in np.unique(labels)])
        centred = f - means[labels]
        precision = np.linalg.inv(centred.T @ centred + reg * np.eye(f.shape[1]))
        diff = g[:, None, :] - means[None]
        total = total + a * (-0.5 * np.einsum("nkf,fg,nkg->nk", diff, precision, diff)).max(1)
    return total


@pytest.mark.parametrize("alpha", [None, [0.5, 1.0, 2.0, 0.25]])
def test_mmahalanobis_is_pytorch_oods_negated(alpha):
    clf, train, labels, test = _setup()
    det = build("mmahalanobis", classifier=clf, maps="relu_conv", layers=[0, 1, 2, 3], alpha=alpha)
    ours = det.fit(ImageSet(images=train, labels=labels)).score(ImageSet(images=test))
    theirs = pytorch_ood_detector().MultiMahalanobis(clf.model.stages(), alpha=alpha)
    zs = [torch.from_numpy(f) for f in _pooled(clf, train, torch.float32)]
    theirs.fit_structured(zs, torch.from_numpy(labels))
    with torch.no_grad():
        expected = -theirs.predict(clf.preprocess(test)).double().numpy()
    np.testing.assert_allclose(ours, expected, rtol=2e-4)
    np.testing.assert_allclose(ours, _float64(clf, train, labels, test, alpha or [1.0] * 4), rtol=1e-6)


def test_mmahalanobis_layers_state_and_edges(tmp_path):
    clf, train, labels, test = _setup()
    det = build("mmahalanobis", classifier=clf, maps="relu_conv", layers=[3, 1]).fit(ImageSet(images=train,
                                                                                              labels=labels))
    per_layer = det.layer_scores(ImageSet(images=test))
    assert per_layer.shape == (9, 2)
    np.testing.assert_allclose(det.score(ImageSet(images=test)), per_layer.sum(1), rtol=1e-12)
    loaded = Detector.from_pretrained(det.save_pretrained(tmp_path / "mm"), classifier=clf, maps="relu_conv")
    np.testing.assert_allclose(loaded.score(ImageSet(images=test)), det.score(ImageSet(images=test)), rtol=1e-12)
    assert det.score(ImageSet(images=[])).shape == (0,)
    every = build("mmahalanobis", classifier=clf, maps="relu_conv").fit(ImageSet(images=train, labels=labels))
    four = build("mmahalanobis", classifier=clf, maps="relu_conv", layers=[0, 1, 2, 3])
    np.testing.assert_array_equal(every.score(ImageSet(images=test)),
                                  four.fit(ImageSet(images=train, labels=labels)).score(ImageSet(images=test)))
    with pytest.raises(ValueError, match="one weight for each of the 4 maps"):
        build("mmahalanobis", classifier=clf, maps="relu_conv", alpha=[1.0]).fit(ImageSet(images=train,
                                                                                        labels=labels))
    with pytest.raises(ValueError, match="alpha"):
        build("mmahalanobis", layers=[0, 1], alpha=[1.0])
    with pytest.raises(ValueError, match="gives 4"):
        build("mmahalanobis", classifier=clf, maps="relu_conv", layers=[4]).fit(ImageSet(images=train,
                                                                                        labels=labels))
    with pytest.raises(ValueError, match="classifier"):
        build("mmahalanobis").fit(ImageSet(images=train, labels=labels))


def test_mmahalanobis_one_class_and_singular_scatter():
    # 30 channels from 8 images: the scatter has rank 7, only reg makes it invertible (as pytorch-ood's +1e-6 I)
    clf, train, labels, test = _setup(width=30, n=8, classes=1, seed=3)
    det = build("mmahalanobis", classifier=clf, maps="relu_conv", layers=[2]).fit(ImageSet(images=train,
                                                                                           labels=labels))
    got = det.score(ImageSet(images=test))
    f, g = _pooled(clf, train)[2], _pooled(clf, test)[2]
    centred = f - f.mean(0)
    assert np.linalg.matrix_rank(centred.T @ centred) == 7
    want = _float64(clf, train, labels, test, [0, 0, 1.0, 0])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert g.shape[1] == 30 and np.isfinite(got).all()


def test_mmahalanobis_defaults_on_a_transformers_resnet(tmp_path):
    from PIL import Image

    from pipelines.classifier import ImageClassifier
    from pipelines.tiny import RESNET_ID, save_tiny_model

    clf = ImageClassifier.from_pretrained(save_tiny_model(tmp_path / "m", RESNET_ID))
    rng = np.random.default_rng(4)
    images = [Image.fromarray(rng.integers(0, 255, (32, 32, 3)).astype(np.uint8)) for _ in range(12)]
    det = build("mmahalanobis", classifier=clf).fit(ImageSet(images=images, labels=np.arange(12) % 3))
    maps = clf.hidden_maps(clf.preprocess(images[:2]))[1]
    assert len(det.stats) == len(maps) >= 2  # every hidden state, the stem's included
    assert np.isfinite(det.score(ImageSet(images=images[:4]))).all()
