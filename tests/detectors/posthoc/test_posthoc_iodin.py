"""i-ODIN against OpenOOD's own postprocessor (golden scores from iodin_postprocessor.py on a small conv net, made by
golden/make_iodin.py at the commit golden/iodin.json names) and a float64 closed form on a linear classifier, plus its
edges."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import softmax
from torch import nn

import detectors
from detectors.posthoc.iodin import largest_gradient_mask
from pipelines.classifier import ImageClassifier

GOLDEN = json.loads((Path(__file__).parent / "golden" / "iodin.json").read_text())
CIFAR10_STD = (0.2470, 0.2435, 0.2616)  # OpenOOD preprocessors/transform.py:4, the golden run's dataset


class SmallNet(nn.Module):
    """make_iodin.py's net: conv 3 -> 4 (3x3), ReLU, global mean pool, linear 4 -> 3."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return self.fc(h), h


class FlatLinear(nn.Module):
    """logits = W vec(x) + b."""

    def __init__(self, size: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(3 * size * size, classes)

    def forward(self, x):
        return self.fc(x.flatten(1)), x.flatten(1)


def _golden_classifier():
    net = SmallNet()
    net.load_state_dict({k: torch.tensor(v, dtype=torch.float32) for k, v in GOLDEN["inputs"]["params"].items()})
    return ImageClassifier.from_module(net, image_size=5, mean=(0.5, 0.5, 0.5), std=CIFAR10_STD)


def _by_hand(clf, x, temperature, noise, std):
    """float64: grad_x CE(z/T, argmax z) = W^T (softmax(z/T) - onehot) / T; only the first element of largest |grad|
    moves, by noise * sign / std of its channel."""
    w, b = clf.head.weight.detach().double().numpy(), clf.head.bias.detach().double().numpy()
    flat = x.double().numpy().reshape(len(x), -1)
    z = flat @ w.T + b
    p = softmax(z / temperature, axis=1)
    p[np.arange(len(z)), z.argmax(axis=1)] -= 1.0
    grad = p @ w / temperature
    channel_std = np.repeat(np.asarray(std, float), flat.shape[1] // 3)
    moved = flat.copy()
    for row, i in enumerate(np.abs(grad).argmax(axis=1)):
        moved[row, i] -= noise * (1.0 if grad[row, i] >= 0 else -1.0) / channel_std[i]
    return softmax((moved @ w.T + b) / temperature, axis=1).max(axis=1)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"T{c['temperature']}-noise{c['noise']}")
def test_iodin_is_openoods(case):
    assert tuple(case["input_std"]) == CIFAR10_STD
    x = torch.tensor(GOLDEN["inputs"]["x"], dtype=torch.float32)
    det = detectors.build("iodin", classifier=_golden_classifier(), batch_size=4, temperature=case["temperature"],
                          noise=case["noise"])
    np.testing.assert_allclose(det.score(x), case["scores"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("temperature, noise", [(1000.0, 0.0014), (10.0, 0.05), (1.0, 0.5)])
def test_iodin_is_the_float64_closed_form(temperature, noise):
    torch.manual_seed(0)
    clf = ImageClassifier.from_module(FlatLinear(6, 5), image_size=6, mean=(0.5,) * 3, std=(0.2, 0.3, 0.4))
    x = torch.randn(7, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    ours = detectors.build("iodin", classifier=clf, batch_size=3, temperature=temperature, noise=noise).score(x)
    expected = _by_hand(clf, x, temperature, noise, (0.2, 0.3, 0.4))
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
    unmoved = _by_hand(clf, x, temperature, 0.0, (0.2, 0.3, 0.4))
    assert np.all(expected > unmoved)  # the one step raises the tempered MSP: the test sees it
    odin = detectors.build("odin", classifier=clf, temperature=temperature, noise=noise).score(x)
    assert np.all(odin - unmoved > expected - unmoved)  # ODIN moves every element, i-ODIN one


def test_iodin_defaults_and_edges():
    cls = detectors.detector_class("iodin")
    assert cls.defaults == {"temperature": 1000.0, "noise": 0.0014, "grad_std": None}
    assert cls.search_space == {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028]}
    assert cls.label == "i-ODIN" and cls.__dict__["label"] != detectors.detector_class("odin").label
    # ties: the first element of largest magnitude; a zero gradient moves element 0 (sign(0) = +1, as there)
    grad = torch.tensor([[[[0.5, -2.0], [2.0, 1.0]]] * 3, [[[0.0, 0.0], [0.0, 0.0]]] * 3])
    mask = largest_gradient_mask(grad)
    assert mask.sum().item() == 2 and mask[0, 0, 0, 1] == 1 and mask[1, 0, 0, 0] == 1
    # one class: the softmax is 1 whatever the input
    torch.manual_seed(1)
    one = ImageClassifier.from_module(FlatLinear(4, 1), image_size=4, mean=(0.5,) * 3, std=(0.2, 0.3, 0.4))
    x = torch.randn(3, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    np.testing.assert_array_equal(detectors.build("iodin", classifier=one).score(x), np.ones(3))
    # no noise at T = 1: the plain MSP
    clf = _golden_classifier()
    x = torch.tensor(GOLDEN["inputs"]["x"], dtype=torch.float32)
    with torch.no_grad():
        msp = softmax(clf(x)[0].double().numpy(), axis=1).max(axis=1)
    np.testing.assert_allclose(detectors.build("iodin", classifier=clf, temperature=1.0, noise=0.0).score(x), msp,
                               rtol=1e-6)
    assert detectors.build("iodin", classifier=clf).score(x[:0]).shape == (0,)
