"""GradUncertainty against pytorch-ood 0.4.0's `GradUncertainty` on the head as its model (per-sample torch.func
gradients of every head parameter), torch autograd in float64 one sample at a time, and C p - 1 by hand."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc.graduncertainty import head_gradient_norm

RNG = np.random.default_rng(11)
D, C = 20, 6
# Weights in 1/64ths and features on a grid of a 16th of their scale (a power of two): every float32 logit is exact,
# so both libraries' products agree in any summation order (on another CPU's kernels a 1-ulp logit moved the
# clamp-bound rows at scale 40 by 6e-5 relative).
HEAD = LinearHead(np.round(RNG.normal(size=(C, D)) * 32).astype(np.float32) / 64,
                  np.round(RNG.normal(size=C) * 64).astype(np.float32) / 64)


def _features(scale: float, n: int = 40) -> np.ndarray:
    step = 2.0 ** (np.round(np.log2(scale)) - 4)
    return (np.round(RNG.normal(size=(n, D)) * scale / step) * step).astype(np.float32)


def _ours(test: np.ndarray, head: LinearHead = HEAD) -> np.ndarray:
    return detectors.build("graduncertainty").fit(FeatureSet(test[:1]), head=head).score(FeatureSet(test))


def _layer(head: LinearHead, dtype=torch.float32) -> torch.nn.Linear:
    layer = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0]).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(head.weight.astype(np.float64)))
        layer.bias.copy_(torch.from_numpy(head.bias.astype(np.float64)))
    return layer


@pytest.mark.parametrize("scale", [0.1, 1.0, 5.0, 40.0])  # 40: p_k (1 - p_k) under 1e-12, torch's clamp decides
def test_graduncertainty_is_pytorch_oods_negated(scale):
    h = _features(scale)
    theirs = -pytorch_ood_detector().GradUncertainty(_layer(HEAD)).predict(torch.from_numpy(h)).double().numpy()
    np.testing.assert_allclose(_ours(h), theirs, rtol=2e-6, atol=1e-30)


def test_graduncertainty_is_float64_autograd_and_c_p_minus_1():
    h = _features(1.0, 12).astype(np.float64)
    layer = _layer(HEAD, torch.float64)
    want = []
    for row in torch.from_numpy(h):
        loss = F.binary_cross_entropy(layer(row[None]).softmax(1), torch.ones(1, C, dtype=torch.float64),
                                      reduction="sum")
        grads = torch.autograd.grad(loss, [layer.weight, layer.bias])
        want.append(sum(float((g ** 2).sum()) for g in grads))
    got = head_gradient_norm(h, HEAD.weight.astype(np.float64), HEAD.bias.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-10)
    z = h @ HEAD.weight.T.astype(np.float64) + HEAD.bias
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    by_hand = ((C * p - 1) ** 2).sum(1) * ((h ** 2).sum(1) + 1)  # no clamp at these logits: g = C p - 1
    np.testing.assert_allclose(got, by_hand, rtol=1e-10)


def test_graduncertainty_edges():
    uniform = LinearHead(np.zeros((C, D), np.float32), np.zeros(C, np.float32))
    np.testing.assert_allclose(_ours(_features(1.0, 3), uniform), 0, atol=1e-12)  # uniform softmax: no gradient
    one = LinearHead(HEAD.weight[:1], HEAD.bias[:1])  # one class: p = 1, torch's gradient (p - 1) / 1e-12 = 0
    np.testing.assert_array_equal(_ours(_features(1.0, 3), one), 0)
    zero = np.zeros((2, D), np.float32)  # h = 0: only the bias gradient, ||C p - 1||^2 at p = softmax(b)
    p = np.exp(HEAD.bias.astype(np.float64)) / np.exp(HEAD.bias.astype(np.float64)).sum()
    np.testing.assert_allclose(_ours(zero), np.full(2, ((C * p - 1) ** 2).sum()), rtol=1e-6)
    assert _ours(_features(1.0, 0)).shape == (0,)
    with pytest.raises(ValueError, match="head"):
        detectors.build("graduncertainty").fit(FeatureSet(zero))
