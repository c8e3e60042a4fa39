"""MC Dropout against OpenOOD's own postprocessor and DropoutNet (golden scores made by golden/make_dropout.py at the
commit golden/dropout.json names, the masks from the same seeded generator) and a float64 replay of the same masks by
hand, plus its edges."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import detectors
from detectors import FeatureSet, LinearHead

GOLDEN = json.loads((Path(__file__).parent / "golden" / "dropout.json").read_text())
HEAD = LinearHead(np.asarray(GOLDEN["inputs"]["weight"], np.float32), np.asarray(GOLDEN["inputs"]["bias"], np.float32))
TEST = np.asarray(GOLDEN["inputs"]["test"], np.float32)


def _ours(test=TEST, head=HEAD, **params):
    return detectors.build("dropout", **params).fit(FeatureSet(TEST[:2]), head=head).score(FeatureSet(test))


def _by_hand(test, p, times, rows, seed, head=HEAD):
    """The masks drawn as torch draws them (bernoulli(1 - p) per element, pass by pass, batch by batch), the rest in
    float64: mean over passes of W (h * mask / (1 - p)) + b, its max softmax."""
    gen = torch.Generator().manual_seed(seed)
    w, b = head.weight.astype(np.float64), head.bias.astype(np.float64)
    out = []
    for start in range(0, len(test), rows):
        h = test[start:start + rows].astype(np.float64)
        logits = np.zeros((len(h), len(b)))
        for _ in range(times):
            mask = torch.empty(h.shape).bernoulli_(1 - p, generator=gen).double().numpy()
            logits += (h * mask / (1 - p)) @ w.T + b
        z = logits / times
        e = np.exp(z - z.max(1, keepdims=True))
        out.append((e / e.sum(1, keepdims=True)).max(1))
    return np.concatenate(out)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"p{c['p']}-T{c['times']}-b{c['batch_rows']}")
def test_dropout_is_openoods(case):
    params = dict(p=case["p"], times=case["times"], batch_rows=case["batch_rows"], seed=case["seed"])
    ours = _ours(**params)
    np.testing.assert_allclose(ours, case["scores"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ours, _by_hand(TEST, case["p"], case["times"], case["batch_rows"], case["seed"]),
                               rtol=1e-5)


def test_dropout_defaults_and_its_generator():
    cls = detectors.detector_class("dropout")
    assert cls.defaults == {"p": 0.5, "times": 5, "seed": 0, "batch_rows": 200} and cls.search_space == {}
    state = torch.random.get_rng_state()
    first = _ours()
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator is left as it was
    np.testing.assert_array_equal(first, _ours())  # seeded: repeatable
    assert not np.array_equal(first, _ours(seed=1))


def test_dropout_edges():
    # no dropout, one pass: the plain MSP of the head
    z = HEAD(TEST.astype(np.float64))
    msp = (np.exp(z - z.max(1, keepdims=True)) / np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)).max(1)
    np.testing.assert_allclose(_ours(p=0.0, times=1), msp, rtol=1e-6)
    # one class: the softmax is 1
    one = LinearHead(HEAD.weight[:1], HEAD.bias[:1])
    np.testing.assert_array_equal(_ours(head=one), np.ones(len(TEST)))
    # ties: a zero row gives the bias alone whatever the mask
    zero = _ours(test=np.zeros((3, TEST.shape[1]), np.float32))
    b = HEAD.bias.astype(np.float64)
    assert np.allclose(zero, np.exp(b - b.max()).max() / np.exp(b - b.max()).sum())
    assert _ours(test=TEST[:0]).shape == (0,)
    with pytest.raises(ValueError, match="p"):
        detectors.build("dropout", p=1.0)
