"""ODIN vs a hand-written float64 input perturbation on a tiny linear classifier (ImageClassifier.from_module)."""
import numpy as np
import pytest
import torch
from PIL import Image
from scipy.special import softmax
from torch import nn

import detectors
from detectors import ImageSet
from pipelines.classifier import ImageClassifier

STD = (0.2, 0.3, 0.4)


class FlatLinear(nn.Module):
    """logits = W vec(x) + b; the features are the flattened pixels."""

    def __init__(self, size: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(3 * size * size, classes)

    def forward(self, x):
        features = x.flatten(1)
        return self.fc(features), features


def _classifier(seed=0, size=6, classes=5):
    torch.manual_seed(seed)
    return ImageClassifier.from_module(FlatLinear(size, classes), image_size=size, mean=(0.5, 0.4, 0.3), std=STD)


def _reference_odin(classifier, pixel_values, temperature, noise, divisor=STD):
    """float64: grad_x CE(z/T, argmax z) = W^T (softmax(z/T) - onehot) / T for z = W x + b; the sign step divided by
    `divisor` per channel (odin_postprocessor.py:40-50)."""
    w = classifier.head.weight.detach().double().numpy()
    b = classifier.head.bias.detach().double().numpy()
    x = pixel_values.double().numpy()
    flat = x.reshape(len(x), -1)
    z = flat @ w.T + b
    p = softmax(z / temperature, axis=1)
    p[np.arange(len(z)), z.argmax(axis=1)] -= 1.0
    grad = (p @ w / temperature).reshape(x.shape)
    step = np.where(grad >= 0, 1.0, -1.0) / np.broadcast_to(np.asarray(divisor, float), (3,))[None, :, None, None]
    perturbed = (x - noise * step).reshape(len(x), -1)
    return softmax((perturbed @ w.T + b) / temperature, axis=1).max(axis=1)


def test_odin_divides_by_05_under_open_insects_and_by_the_std_otherwise():
    """Open-Insect's eval.sh:67 names the region, absent from transform.py:3-12, so odin_postprocessor.py:18-21 divides
    the sign step by 0.5 (ODIN and RP-ODIN); OpenOOD on a named benchmark and `exact` by the normalisation std."""
    from detectors.harness.protocols import protocol_params
    from detectors.posthoc.mdsens import MDSEnsemble
    from detectors.posthoc.odin import REFERENCE_GRAD_STD

    assert REFERENCE_GRAD_STD == 0.5 and MDSEnsemble.defaults["grad_std"] == REFERENCE_GRAD_STD  # one definition
    for name in ("odin", "rp_odin"):
        assert protocol_params("open-insects", name)["grad_std"] == 0.5
        assert ("grad_std" not in protocol_params("openood_v1.5", name)
                and "grad_std" not in protocol_params("exact", name))
    clf = _classifier(seed=2)
    x = torch.randn(6, 3, 6, 6, generator=torch.Generator().manual_seed(3))
    temperature, noise = 10.0, 0.05
    half = detectors.build("odin", classifier=clf, temperature=temperature, noise=noise, grad_std=0.5).score(x)
    np.testing.assert_allclose(half, _reference_odin(clf, x, temperature, noise, divisor=0.5), rtol=1e-5)
    std = detectors.build("odin", classifier=clf, temperature=temperature, noise=noise).score(x)
    np.testing.assert_allclose(std, _reference_odin(clf, x, temperature, noise), rtol=1e-5)
    assert np.abs(half - std).max() > 1e-4  # the two steps differ: the test sees the divisor


@pytest.mark.parametrize("temperature, noise", [(1000.0, 0.0014), (10.0, 0.05)])
def test_odin_matches_float64_reference_on_tensors(temperature, noise):
    clf = _classifier()
    x = torch.randn(7, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    det = detectors.build("odin", classifier=clf, batch_size=3, temperature=temperature, noise=noise)
    got, expected = det.score(x), _reference_odin(clf, x, temperature, noise)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    # the perturbation's own effect (small at T=1000) must match too, not only the near-uniform level
    unperturbed = _reference_odin(clf, x, temperature, 0.0)
    assert np.all(expected - unperturbed > 0)  # the step raises the temperature-scaled MSP
    np.testing.assert_allclose(got - unperturbed, expected - unperturbed, rtol=1e-2)


def test_odin_without_noise_at_t1_is_msp_and_restores_training_mode():
    clf = _classifier(seed=2)
    clf.train()
    x = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(3))
    scores = detectors.build("odin", classifier=clf, temperature=1.0, noise=0.0).score(x)
    with torch.no_grad():
        logits = clf(x)[0].double().numpy()
    np.testing.assert_allclose(scores, softmax(logits, axis=1).max(axis=1), rtol=1e-6)
    assert clf.training


def test_odin_on_an_imageset_equals_preprocessed_tensor_path():
    clf = _classifier(seed=4)
    rng = np.random.default_rng(5)
    images = [Image.fromarray(rng.integers(0, 256, size=(9, 11, 3), dtype=np.uint8)) for _ in range(5)]
    det = detectors.build("odin", classifier=clf, batch_size=2)
    from_images = det.score(ImageSet(images=images))
    x = clf.preprocess(images)
    np.testing.assert_allclose(from_images, _reference_odin(clf, x, 1000.0, 0.0014), rtol=1e-5)
    np.testing.assert_array_equal(from_images, det.score(x))


def test_odin_needs_a_classifier_and_images():
    with pytest.raises(ValueError, match="classifier"):
        detectors.build("odin").score(torch.zeros(1, 3, 6, 6))
    with pytest.raises(TypeError, match="ImageSet"):
        detectors.build("odin", classifier=_classifier()).score(np.zeros((2, 5)))
    assert detectors.detector_class("odin").accepts("classifier")


def test_odin_on_a_reloaded_transformers_classifier_matches_per_sample_backward(tmp_path):
    """The hub loading path (tiny ResNet saved and reloaded) vs one F.cross_entropy backward per image."""
    from transformers import ResNetForImageClassification, ViTImageProcessor

    from pipelines.toydata import tiny_digit_classifier_config

    torch.manual_seed(0)
    config, _ = tiny_digit_classifier_config(num_labels=4)
    processor = ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.4, 0.5, 0.6],
                                  image_std=[0.2, 0.25, 0.3])
    ResNetForImageClassification(config).save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    clf = ImageClassifier.from_pretrained(tmp_path)
    rng = np.random.default_rng(6)
    images = [Image.fromarray(rng.integers(0, 256, size=(20, 18, 3), dtype=np.uint8)) for _ in range(3)]
    temperature, noise = 10.0, 0.01
    modes = [m.training for m in clf.modules()]
    scores = (detectors.build("odin", classifier=clf, batch_size=2, temperature=temperature, noise=noise)
              .score(ImageSet(images=images)))
    assert [m.training for m in clf.modules()] == modes and not clf.model.training  # eval model stays in eval

    std = torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    expected = []
    for image in images:
        x = torch.from_numpy(processor(images=image, return_tensors="np")["pixel_values"]).requires_grad_(True)
        logits = clf.model(pixel_values=x).logits
        torch.nn.functional.cross_entropy(logits / temperature, logits.argmax(dim=1)).backward()
        perturbed = x.detach() - noise * torch.where(x.grad >= 0, 1.0, -1.0) / std
        with torch.no_grad():
            out = clf.model(pixel_values=perturbed).logits.double().numpy()
        expected.append(softmax(out / temperature, axis=1).max())
    np.testing.assert_allclose(scores, expected, rtol=1e-4)


@pytest.mark.parametrize("name", ["odin", "rp_odin"])
def test_image_level_sweep_on_validation_images_matches_a_manual_loop(name):
    """ODIN / RP-ODIN sweep OpenOOD's T x noise grid on ID-val and OOD-val images (the runner's builder `make` gives
    each point the shared classifier); the chosen point is the manual loop's last maximum, in OpenOOD's order."""
    from detectors.harness.protocols import sweep_space
    from detectors.harness.selection import grid, select
    from detectors.metrics import auroc

    clf = _classifier(seed=3)
    rng = np.random.default_rng(4)
    image = lambda low, high: Image.fromarray(rng.integers(low, high, (6, 6, 3)).astype(np.uint8))  # noqa: E731
    # a skewed prior
    train = ImageSet(images=[image(0, 256) for _ in range(20)], labels=np.r_[np.zeros(12, int), np.arange(8) % 4 + 1])
    id_val = ImageSet(images=[image(0, 256) for _ in range(12)], labels=np.arange(12) % 5)
    ood_val = ImageSet(images=[image(40, 216) for _ in range(12)])
    space = sweep_space("open-insects", name, {})
    assert space == {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028]}
    make = lambda params: detectors.build(name, classifier=clf, **params)  # noqa: E731
    best, params, table = select(name, id_val, ood_val, id_train=train, space=space, make=make, fit_kwargs={})
    manual = []
    for point in grid(space):
        det = make(point).fit(train)
        manual.append(auroc(det.score(id_val), det.score(ood_val)))
    assert [row["auroc"] for row in table] == manual and len(set(manual)) > 1
    assert params == grid(space)[max(i for i, v in enumerate(manual) if v == max(manual))]  # the last maximum
    assert best.fitted and {k: best.params[k] for k in ("temperature", "noise")} == params
