"""CF-OOD against OpenOOD's own postprocessor (golden scores from cfood_postprocessor.py, made by
golden/make_cfood.py at the commit golden/cfood.json names) and the reference's loop replayed in float64 by hand,
plus its edges."""
import json
from pathlib import Path

import numpy as np
import pytest

import detectors
from detectors import FeatureSet
from detectors.posthoc import cfood

GOLDEN = json.loads((Path(__file__).parent / "golden" / "cfood.json").read_text())
TRAIN = np.asarray(GOLDEN["inputs"]["train"], dtype=np.float32)
TEST = np.asarray(GOLDEN["inputs"]["test"], dtype=np.float32)


def _ours(train=TRAIN, test=TEST, **params):
    return detectors.build("cfood", **params).fit(FeatureSet(train)).score(FeatureSet(test))


def _by_hand(train, test, k):
    """cfood_postprocessor.py:95-177 at alpha 1, literally, in float64 (row-by-row differences, full sorts)."""
    def unit(h):
        h = h.astype(np.float64)
        return h / (np.linalg.norm(h, axis=1, keepdims=True) + 1e-10)

    ref, n = unit(train), len(train)
    kval = np.concatenate((np.linspace(0.001, 0.1, 100), np.linspace(0.105, 0.5, 81), np.linspace(0.51, 0.99, 49)))
    kpos = np.array(kval * n - 1, dtype=int)
    keep = np.concatenate(([True], kpos[:-1] < kpos[1:]))
    kval, kpos = kval[keep], kpos[keep]
    table = np.stack([np.sort(((r - ref) ** 2).sum(1))[kpos + 1] for r in ref])
    out = []
    for v in unit(test):
        count = (table >= ((v - ref) ** 2).sum(1)[:, None]).sum(0) / n
        hits = np.nonzero(count >= k)[0]
        out.append(-(kval[hits[0]] if len(hits) else 1.0))
    return np.array(out)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"alpha{c['alpha']}-k{c['k']}")
def test_cfood_is_openoods(case):
    # the reference draws its rows with torch.randperm: ours at alpha 1 on the rows it drew
    train = TRAIN[np.asarray(case["rows"])]
    ours = _ours(train, alpha=1, k=case["k"])
    np.testing.assert_array_equal(ours, case["scores"])
    np.testing.assert_array_equal(ours, _by_hand(train, TEST, case["k"]))


def test_cfood_draws_int_alpha_n_rows():
    det = detectors.build("cfood", alpha=0.5, k=0.05, seed=3).fit(FeatureSet(TRAIN))
    rows = det.reference_rows(len(TRAIN))
    assert len(rows) == 100 and len(np.unique(rows)) == 100
    np.testing.assert_array_equal(det.score(FeatureSet(TEST)), _by_hand(TRAIN[rows], TEST, 0.05))
    assert not np.array_equal(rows, detectors.build("cfood", alpha=0.5, seed=4).reference_rows(len(TRAIN)))


def test_cfood_defaults_and_grid():
    cls = detectors.detector_class("cfood")
    assert cls.defaults == {"alpha": 0.1, "k": 0.01, "seed": 0}
    assert cls.search_space == {"alpha": [0.1, 0.5, 1], "k": [0.001, 0.005, 0.01, 0.05]}
    assert cls.grids == {"openood_v1.5": {}}  # APS_mode false: the defaults run
    kval, kpos = cfood.kappa_grid(200)
    assert kval[0] == 0.001 and np.all(np.diff(kpos) > 0) and kpos[-1] + 1 < 200


def test_cfood_edges(monkeypatch):
    # ties: a training set of one repeated point; that point is in every neighbourhood at once, any other in none
    same = np.repeat(TRAIN[:1], 30, axis=0)
    scores = _ours(same, np.stack([TRAIN[0], TRAIN[0] * 2, TRAIN[1]]), alpha=1)
    np.testing.assert_array_equal(scores, [-0.001, -0.001, -1.0])  # a scaled copy is the same unit row
    # D > N, a zero row (it normalises to 0, at distance 1 from every unit row), small blocks
    monkeypatch.setattr(cfood, "BLOCK_ENTRIES", 5)
    few = TRAIN[:5]
    test = np.concatenate([TEST[:6], np.zeros((1, TEST.shape[1]), np.float32)])
    np.testing.assert_array_equal(_ours(few, test, alpha=1, k=0.2), _by_hand(few, test, 0.2))
    assert _ours(test=TEST[:0]).shape == (0,)
    with pytest.raises(ValueError, match="at least 2 rows"):
        detectors.build("cfood", alpha=0.1).fit(FeatureSet(TRAIN[:15]))


def test_cfood_round_trips(tmp_path):
    det = detectors.build("cfood", alpha=0.5).fit(FeatureSet(TRAIN))
    det.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(FeatureSet(TEST)), det.score(FeatureSet(TEST)))
