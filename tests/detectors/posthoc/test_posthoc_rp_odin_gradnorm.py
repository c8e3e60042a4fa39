"""RP-GradNorm and RP-ODIN against independent float64 computations: the autograd gradient of the cross-entropy to the
class prior, and ODIN's perturbation worked out by hand for a linear classifier."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from detectors import FeatureSet, ImageSet, LinearHead, build
from detectors.base import Detector


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_rp_gradnorm_is_the_gradient_norm_of_the_cross_entropy_to_the_prior(tmp_path):
    rng = np.random.default_rng(0)
    d, c = 5, 4
    labels = np.array([0, 0, 0, 1, 2, 2, 3, 3])
    w, b = rng.normal(size=(c, d)), rng.normal(size=c)
    train = FeatureSet(rng.normal(size=(8, d)), None, labels)
    test = rng.normal(size=(6, d))
    det = build("rp_gradnorm").fit(FeatureSet(train.features, train.features @ w.T + b, labels), head=LinearHead(w, b))
    prior = np.bincount(labels, minlength=c) / len(labels)
    want = []
    for h in test:
        weight = torch.tensor(w, requires_grad=True)
        logits = weight @ torch.tensor(h) + torch.tensor(b)
        loss = -(torch.tensor(prior) * torch.log_softmax(logits, 0)).sum()
        (grad,) = torch.autograd.grad(loss, weight)
        want.append(grad.abs().sum().item() / (d * c))
    np.testing.assert_allclose(det.score(FeatureSet(test)), want, rtol=1e-10)
    loaded = Detector.from_pretrained(det.save_pretrained(tmp_path / "rpgn"))
    np.testing.assert_array_equal(loaded.score(FeatureSet(test)), det.score(FeatureSet(test)))


def test_rp_odin_by_hand_on_a_linear_classifier():
    from PIL import Image

    from pipelines.classifier import ImageClassifier

    torch.manual_seed(0)

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.flat, self.fc = torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 3)

        def forward(self, x):
            h = self.flat(x)
            return self.fc(h), h

    clf = ImageClassifier.from_module(Linear(), image_size=4)
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 255, (4, 4, 3)).astype(np.uint8)) for _ in range(6)]
    train = ImageSet(images=images, labels=np.array([0, 0, 1, 2, 2, 2]))
    temperature, noise = 10.0, 0.01
    det = build("rp_odin", classifier=clf, temperature=temperature, noise=noise).fit(train)
    x = clf.preprocess(images).double().numpy().reshape(6, -1)
    a, b = clf.head.weight.double().detach().numpy(), clf.head.bias.double().detach().numpy()
    z = x @ a.T + b
    pred = z.argmax(1)
    grad = (_softmax(z / temperature) - np.eye(3)[pred]) @ a  # d/dx of -T log softmax(z/T)[pred] for z = Ax + b
    std = np.repeat(np.array(clf.std.flatten()), 16)
    perturbed = x - noise * np.where(grad >= 0, 1.0, -1.0) / std
    odin = _softmax((perturbed @ a.T + b) / temperature).max(1)
    prior = np.array([2, 1, 3]) / 6
    p = _softmax(z)
    weight = 1 - p @ prior / (np.linalg.norm(p, axis=1) * np.linalg.norm(prior))
    np.testing.assert_allclose(det.score(ImageSet(images=images)), weight * odin, rtol=1e-5)
    with pytest.raises(RuntimeError, match="fit"):
        build("rp_odin", classifier=clf).score(ImageSet(images=images))
