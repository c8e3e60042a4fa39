"""AdaSCALE A and L against OpenOOD's own postprocessor and network wrappers (golden scores from
adascale_postprocessor.py + networks/adascale_net.py on a small conv net, made by golden/make_adascale.py at the commit
golden/adascale.json names) and a float64 replay by hand on a linear classifier, plus the edges."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import detectors
from detectors.posthoc.adascale import PERCENTILE_PAIRS, adaptive_ratio
from pipelines.classifier import ImageClassifier

GOLDEN = json.loads((Path(__file__).parent / "golden" / "adascale.json").read_text())
VAL = torch.tensor(GOLDEN["inputs"]["val"], dtype=torch.float32)
TEST = torch.tensor(GOLDEN["inputs"]["test"], dtype=torch.float32)


class Backbone(nn.Module):
    """make_adascale.py's net: conv 3 -> 200 (3x3), ReLU, global mean pool, minus 0.05, linear 200 -> 5."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 200, 3, padding=1)
        self.fc = nn.Linear(200, 5)

    def forward(self, x):
        h = torch.relu(self.conv(x)).mean(dim=(2, 3)) - 0.05
        return self.fc(h), h


class FlatLinear(nn.Module):
    """logits = W vec(x) + b; the features are the flattened pixels."""

    def __init__(self, size: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(3 * size * size, classes)

    def forward(self, x):
        return self.fc(x.flatten(1)), x.flatten(1)


def _golden_classifier():
    net = Backbone()
    net.load_state_dict({k: torch.tensor(v, dtype=torch.float32) for k, v in GOLDEN["inputs"]["params"].items()})
    return ImageClassifier.from_module(net, image_size=6, mean=(0.5,) * 3, std=(0.25,) * 3)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{c['wrapper']}-{c['percentile']}-o{c['o']}")
def test_adascale_is_openoods(case):
    # the reference keeps num_samples = 20 of the 32 val rows by torch.randperm: ours on the rows it drew
    params = {k: case[k] for k in ("percentile", "k1", "k2", "lmbda", "o")}
    det = detectors.build(f"adascale_{case['wrapper']}", classifier=_golden_classifier(), batch_size=5, **params)
    det.fit(TEST[:1], id_val=VAL[np.asarray(case["rows"])])
    np.testing.assert_allclose(det.score(TEST), case["scores"], rtol=2e-5)


def _by_hand(clf, fit, test, lo, hi, k1, k2, lmbda, o, logit_scaling):
    """float64 on a linear classifier: grad_x of the top logit is W[top]; the int(D o) smallest |W[top]| elements move
    by 0.5 sign(W[top]); h = x, so the shift there is 0.5."""
    w, b = clf.head.weight.detach().double().numpy(), clf.head.bias.detach().double().numpy()

    def stat(x):
        h = x.double().numpy().reshape(len(x), -1)
        d = h.shape[1]
        out = []
        for row in h:
            g = w[np.argmax(w @ row + b)]
            moved = row.copy()
            small = np.argsort(np.abs(g), kind="stable")[:int(d * o)]
            moved[small] += 0.5 * np.sign(g[small])
            top1 = np.argsort(-row, kind="stable")[:int(d * k1 / 100)]
            top2 = np.argsort(-row, kind="stable")[:int(d * k2 / 100)]
            out.append(np.maximum(moved[top1], 0).sum() + lmbda * np.abs(row - moved)[top2].sum())
        return h, np.array(out)

    _, fit_q = stat(fit)
    h, q = stat(test)
    p = lo + (1 - (fit_q[None, :] <= q[:, None]).mean(1)) * (hi - lo)
    r = np.maximum(h, 0)
    ratio = np.array([row.sum() / np.sort(row)[::-1][:len(row) - int(np.round(len(row) * pi / 100))].sum()
                      for row, pi in zip(r, p)])
    logits = (h @ w.T + b) * ratio[:, None] ** 2 if logit_scaling else (h * np.exp(ratio)[:, None]) @ w.T + b
    m = logits.max(1)
    return m + np.log(np.exp(logits - m[:, None]).sum(1))


@pytest.mark.parametrize("name", ["adascale_a", "adascale_l"])
@pytest.mark.parametrize("lo, hi, k1, k2, lmbda, o", [(75, 85, 5, 10, 10, 0.05), (60, 95, 20, 5, 1, 0.3)])
def test_adascale_is_the_float64_replay(name, lo, hi, k1, k2, lmbda, o):
    torch.manual_seed(0)
    clf = ImageClassifier.from_module(FlatLinear(4, 3), image_size=4, mean=(0.5,) * 3, std=(0.25,) * 3)
    g = torch.Generator().manual_seed(1)
    fit, test = torch.randn(9, 3, 4, 4, generator=g), torch.randn(6, 3, 4, 4, generator=g)
    det = detectors.build(name, classifier=clf, percentile=[lo, hi], k1=k1, k2=k2, lmbda=lmbda, o=o)
    ours = det.fit(test[:1], id_val=fit).score(test)
    expected = _by_hand(clf, fit, test, lo, hi, k1, k2, lmbda, o, name == "adascale_l")
    np.testing.assert_allclose(ours, expected, rtol=1e-5)
    assert len(np.unique(det.percentiles(det._passes(test)[1]))) > 2  # the ECDF spreads the percentiles


def test_adascale_defaults_grid_and_facts():
    for name, label in (("adascale_a", "AdaSCALE-A"), ("adascale_l", "AdaSCALE-L")):
        cls = detectors.detector_class(name)
        assert cls.label == label and "label" in cls.__dict__
        assert cls.defaults == {"percentile": [75, 85], "k1": 5, "k2": 1, "lmbda": 10, "o": 0.05,
                                "num_samples": 5000, "seed": 0, "fit_split": "id_val"}
        assert cls.search_space["percentile"] == PERCENTILE_PAIRS and len(PERCENTILE_PAIRS) == 36
    assert [60, 65] in PERCENTILE_PAIRS and [95, 99] in PERCENTILE_PAIRS and [65, 65] not in PERCENTILE_PAIRS


def test_adascale_edges():
    clf = _golden_classifier()
    det = detectors.build("adascale_a", classifier=clf, num_samples=7, seed=1).fit(None, id_val=VAL)
    assert len(det.fit_stats) == 7 and np.all(np.diff(det.fit_stats) >= 0)  # num_samples of the rows, sorted
    # ties: a fit row scored again counts itself in the ECDF (<=); equal statistics get equal percentiles
    stats = det.fit_stats[[0, 0, -1]]
    np.testing.assert_allclose(det.percentiles(stats), [75 + (1 - 1 / 7) * 10, 75 + (1 - 1 / 7) * 10, 75.0])
    # the fit images scored again meet their own statistics exactly: the ranks 1 ... n of the ECDF
    whole = detectors.build("adascale_l", classifier=clf).fit(None, id_val=VAL)
    ranks = np.sort(whole.percentiles(whole._passes(VAL)[1]))[::-1]
    np.testing.assert_allclose(ranks, 75 + (1 - np.arange(1, 33) / 32) * 10)
    # the ratio keeps at least one activation; an all-non-positive row gets 1 (the reference: 0/0)
    np.testing.assert_allclose(adaptive_ratio(np.array([[1.0, 1.0, 1.0, 1.0], [-1.0, 0.0, -2.0, 0.0]]),
                                              np.array([99.0, 50.0])), [4.0, 1.0])
    # one class: the energy is the one logit, scaled
    torch.manual_seed(2)
    one = ImageClassifier.from_module(FlatLinear(4, 1), image_size=4, mean=(0.5,) * 3, std=(0.25,) * 3)
    x = torch.randn(5, 3, 4, 4, generator=torch.Generator().manual_seed(3))
    got = detectors.build("adascale_l", classifier=one, k2=10).fit(None, id_val=x).score(x)
    np.testing.assert_allclose(got, _by_hand(one, x, x, 75, 85, 5, 10, 10, 0.05, True), rtol=1e-5)
    assert det.score(TEST[:0]).shape == (0,)
    with pytest.raises(ValueError, match="id_val"):
        detectors.build("adascale_a", classifier=clf).fit(VAL)
    with pytest.raises(ValueError, match="percentile must be"):
        detectors.build("adascale_a", percentile=[85, 75])
    with pytest.raises(ValueError, match="percentile must be"):
        detectors.detector_class("adascale_l").check_params({"percentile": [60, 100]})
    with pytest.raises(ValueError, match="classifier"):
        detectors.build("adascale_a").fit(None, id_val=VAL)
