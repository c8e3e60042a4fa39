"""NNGuide against pytorch-ood 0.4.0's `NNGuide` (every fit row banked), the official rule (roomo7time/nnguide:
normalised features, energy-scaled bank, mean of the top-k inner products times the energy) by hand in float64 on the
official 1% bank, and its edges."""
import numpy as np
import pytest
import torch
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc.nnguide import bank_rows

RNG = np.random.default_rng(3)
D, C = 24, 4
HEAD = LinearHead((RNG.normal(size=(C, D)) * 0.4).astype(np.float32), RNG.normal(size=C).astype(np.float32))
TRAIN = np.maximum(RNG.normal(size=(500, D)) + 0.5, 0).astype(np.float32)
TEST = np.maximum(RNG.normal(size=(60, D)) * 1.5, 0).astype(np.float32)


def fs(h):
    return FeatureSet(h, logits=HEAD(h))


def _by_hand(bank_h: np.ndarray, test: np.ndarray, k: int) -> np.ndarray:
    def lse(z):
        return z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1))

    norm = lambda h: h / np.linalg.norm(h, axis=1, keepdims=True)  # noqa: E731
    bank = norm(bank_h.astype(np.float64)) * lse(HEAD(bank_h.astype(np.float64)))[:, None]
    sims = norm(test.astype(np.float64)) @ bank.T
    return np.sort(sims, axis=1)[:, -k:].mean(1) * lse(HEAD(test.astype(np.float64)))


@pytest.mark.parametrize("k", [1, 10, 50])
def test_nnguide_is_pytorch_oods_negated(k):
    layer = torch.nn.Linear(D, C)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(HEAD.weight.astype(np.float32)))
        layer.bias.copy_(torch.from_numpy(HEAD.bias.astype(np.float32)))
    theirs = pytorch_ood_detector().NNGuide(None, head=layer, k=k)
    theirs.fit_features(torch.from_numpy(TRAIN), torch.zeros(len(TRAIN), dtype=torch.long))
    expected = -theirs.predict_features(torch.from_numpy(TEST)).double().numpy()
    ours = detectors.build("nnguide", k=k, bank_fraction=1.0).fit(fs(TRAIN)).score(fs(TEST))
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_the_official_one_percent_bank_by_hand():
    det = detectors.build("nnguide").fit(fs(np.tile(TRAIN, (4, 1))))  # 2,000 rows: the official 1% banks 20
    rows = bank_rows(2000, 0.01, 10, 0)
    assert len(rows) == 20 and det.bank.shape == (20, D)
    np.testing.assert_allclose(det.score(fs(TEST)), _by_hand(np.tile(TRAIN, (4, 1))[rows], TEST, 10), rtol=1e-5)


def test_nnguide_edges(tmp_path):
    assert len(bank_rows(100, 0.01, 10, 0)) == 10  # int(1) < k: k rows banked
    assert list(bank_rows(5, 1.0, 10, 0)) == list(range(5))
    with pytest.raises(ValueError, match="k=10 needs at least 10 training rows"):
        detectors.build("nnguide").fit(fs(TRAIN[:9]))
    tied = np.tile(TRAIN[:1], (12, 1))  # every bank row the same: guidance = that one inner product
    det = detectors.build("nnguide", bank_fraction=1.0).fit(fs(tied))
    np.testing.assert_allclose(det.score(fs(TEST[:5])), _by_hand(tied, TEST[:5], 10), rtol=1e-5)
    zero = np.zeros((2, D), dtype=np.float32)  # a zero feature row: no guidance, score 0 (torch's normalize)
    assert np.all(det.score(fs(zero)) == 0)
    assert det.score(fs(TEST[:0])).shape == (0,)
    det.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(fs(TEST)), det.score(fs(TEST)))
