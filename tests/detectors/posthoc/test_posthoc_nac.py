"""NAC against pytorch-ood 0.4.0's `NACUE` on a pooled layer before the head (its hooks and autograd; `variant:
pytorch-ood`, every fit row) and the official avgpool rule (BierOne/ood_coverage coverage.py, instr_state.py,
utils.py) replayed in float64 by hand: the subset, the thresholds, the counts and the coverage, plus its edges."""
import numpy as np
import pytest
import torch
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc import streaming
from detectors.posthoc.nac import balanced_subset, official_thresholds

RNG = np.random.default_rng(9)
D, C = 32, 5
TRAIN = np.abs(RNG.normal(size=(300, D))).astype(np.float32)
LABELS = np.arange(300) % C
TEST = np.abs(RNG.normal(size=(40, D)) * 1.3).astype(np.float32)
HEAD = LinearHead((RNG.normal(size=(C, D)) * 0.3).astype(np.float32), RNG.normal(size=C).astype(np.float32))


class Pooled(torch.nn.Module):
    """[B, D, 1, 1] maps -> pooled -> the head: the avgpool layer NAC reads."""

    def __init__(self):
        super().__init__()
        self.pool, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Linear(D, C)
        with torch.no_grad():
            self.fc.weight.copy_(torch.from_numpy(HEAD.weight))
            self.fc.bias.copy_(torch.from_numpy(HEAD.bias))

    def forward(self, x):
        return self.fc(self.pool(x).flatten(1))


def _ours(train=TRAIN, test=TEST, labels=LABELS, **params):
    return detectors.build("nac", **params).fit(FeatureSet(train, labels=labels), head=HEAD).score(FeatureSet(test))


@pytest.mark.parametrize("alpha, o_star, m_bins", [(100.0, 50, 50), (10.0, 5, 20), (1000.0, 10, 7)])
def test_nac_pytorch_ood_variant_is_nacues_negated(alpha, o_star, m_bins):
    model = Pooled().eval()
    theirs = pytorch_ood_detector().NACUE(model, layers=[model.pool], m_bins=m_bins, alpha=alpha, o_star=o_star)
    maps = torch.from_numpy(TRAIN)[:, :, None, None].requires_grad_()  # the pooled map in a graph, as in a network
    theirs.fit([maps[:128], maps[128:]])
    expected = -theirs.predict(torch.from_numpy(TEST)[:, :, None, None].requires_grad_()).double().numpy()
    got = _ours(variant="pytorch-ood", valid_num=None, sig_alpha=alpha, o_star=o_star, m_bins=m_bins)
    np.testing.assert_allclose(got, expected, atol=1e-6)  # every state in the same bin (float32 means differ)


def _official(train, labels, test, o_star=50, m=50, alpha=100.0, valid_num=1000):
    """Float64 replay: subset, grad of -mean log_softmax w.r.t. h, sigmoid, intervals [t_i, t_i+1), coverage."""
    w, b = HEAD.weight.astype(np.float64), HEAD.bias.astype(np.float64)
    k = len(np.unique(labels))
    per = min(int(valid_num / k), min(np.sum(labels == c) for c in np.unique(labels)))
    rows = []
    for c in dict.fromkeys(labels):
        idx = list(np.flatnonzero(labels == c))
        np.random.RandomState(1).shuffle(idx)
        rows += idx[:per]

    def states(h):
        h = h.astype(np.float64)
        z = h @ w.T + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        return 1 / (1 + np.exp(-alpha * h * ((p - 1 / k) @ w)))

    half = m // 2
    x_l = np.log(np.linspace(1, np.sqrt(1000), half)) / np.log(1000)
    t = np.concatenate([x_l[:-1], 1 - x_l[::-1]])
    t[-1] += 0.01
    t = np.append(t, 1.2)
    hit = lambda s: (s[:, None, :] >= t[:-1, None]) & (s[:, None, :] < t[1:, None])  # noqa: E731  [n, M-1, D]
    coverage = np.minimum(hit(states(train[rows])).sum(0) / o_star, 1)
    return (hit(states(test)) * coverage[None]).sum(1).mean(1)


def test_nac_is_the_official_rule():
    np.testing.assert_allclose(_ours(), _official(TRAIN, LABELS, TEST), atol=1e-6)
    np.testing.assert_allclose(_ours(valid_num=40, o_star=3, m_bins=20, sig_alpha=10.0),
                               _official(TRAIN, LABELS, TEST, o_star=3, m=20, alpha=10.0, valid_num=40), atol=1e-6)
    assert len(official_thresholds(50)) == 50 and official_thresholds(50)[0] == 0 and official_thresholds(50)[-1] == 1.2


def test_nac_defaults_subset_and_edges():
    cls = detectors.detector_class("nac")
    assert cls.defaults == {"o_star": 50, "m_bins": 50, "sig_alpha": 100.0, "valid_num": 1000, "variant": "official"}
    labels = np.array([2, 0, 2, 1, 0, 2, 2])
    rows = balanced_subset(labels, 6)  # int(6 / 3) = 2, capped at the smallest class (1): one row each, 2 first
    assert sorted(labels[rows].tolist()) == [0, 1, 2] and labels[rows[0]] == 2
    assert len(balanced_subset(np.arange(5), 2)) == 5  # more classes than rows asked: one each (the official: none)
    assert _ours(test=TEST[:0]).shape == (0,)
    scores = _ours()
    assert ((scores >= 0) & (scores <= 1)).all()
    np.testing.assert_array_equal(_ours(train=TRAIN[:1], labels=LABELS[:1], o_star=1, test=TRAIN[:1]), [1.0])
    with pytest.raises(ValueError, match="labels"):
        detectors.build("nac").fit(FeatureSet(TRAIN), head=HEAD)
    detectors.build("nac", valid_num=None).fit(FeatureSet(TRAIN), head=HEAD)  # no labels needed then
    with pytest.raises(ValueError, match="m_bins must be even"):
        detectors.build("nac", m_bins=7)
    with pytest.raises(ValueError, match="no training features"):
        _ours(train=TRAIN[:0], labels=LABELS[:0])


def test_nac_state_round_trip(tmp_path):
    det = detectors.build("nac").fit(FeatureSet(TRAIN, labels=LABELS), head=HEAD)
    again = detectors.detector_class("nac").from_pretrained(det.save_pretrained(tmp_path))
    np.testing.assert_array_equal(again.score(FeatureSet(TEST)), det.score(FeatureSet(TEST)))
    with streaming.chunk_rows(7):  # fit and score a chunk of rows at a time: the same counts and scores
        chunked = detectors.build("nac", valid_num=None).fit(FeatureSet(TRAIN), head=HEAD)
        chunked_scores = chunked.score(FeatureSet(TEST))
    whole = detectors.build("nac", valid_num=None).fit(FeatureSet(TRAIN), head=HEAD)
    np.testing.assert_array_equal(chunked.counts, whole.counts)
    np.testing.assert_allclose(chunked_scores, whole.score(FeatureSet(TEST)), rtol=1e-12)
