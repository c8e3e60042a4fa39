"""VRA against OpenOOD's own postprocessor (golden scores and thresholds from vra_postprocessor.py, made by
golden/make_vra.py at the commit golden/vra.json names) and a float64 replay by hand, plus its edges."""
import json
from pathlib import Path

import numpy as np
import pytest

import detectors
from detectors import FeatureSet, LinearHead

GOLDEN = json.loads((Path(__file__).parent / "golden" / "vra.json").read_text())
INPUTS = {k: np.asarray(v, dtype=np.float32) for k, v in GOLDEN["inputs"].items()}
HEAD = LinearHead(INPUTS["weight"], INPUTS["bias"])
VAL, TEST = INPUTS["val"], INPUTS["test"]


def _fitted(val=VAL, head=HEAD, **params):
    return detectors.build("vra", **params).fit(FeatureSet(TEST[:2]), head=head, id_val=FeatureSet(val))


def _by_hand(val, test, high, low, head=HEAD):
    lo, hi = np.percentile(val.astype(np.float64), [low, high])
    z = np.clip(test.astype(np.float64), lo, hi) @ head.weight.T.astype(np.float64) + head.bias
    return z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1))


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{c['percentile_high']}-{c['percentile_low']}")
def test_vra_is_openoods(case):
    high, low = case["percentile_high"], case["percentile_low"]
    det = _fitted(percentile_high=high, percentile_low=low)
    np.testing.assert_allclose([det.low, det.high], case["thresholds"], rtol=1e-6)
    ours = det.score(FeatureSet(TEST))
    np.testing.assert_allclose(ours, case["scores"], rtol=1e-5)
    np.testing.assert_allclose(ours, _by_hand(VAL, TEST, high, low), rtol=1e-5)


def test_vra_defaults_and_fit_source():
    cls = detectors.detector_class("vra")
    assert cls.defaults == {"percentile_high": 90, "percentile_low": 10}
    assert cls.search_space == {"percentile_high": [85, 90, 95, 99], "percentile_low": [1, 5, 10, 15]}
    train_only = detectors.build("vra").fit(FeatureSet(VAL), head=HEAD)  # no id_val: the training rows
    np.testing.assert_allclose(train_only.score(FeatureSet(TEST)), _by_hand(VAL, TEST, 90, 10), rtol=1e-5)


def test_vra_edges():
    # the whole range: plain energy; ties: equal low and high clip every activation to one value
    np.testing.assert_allclose(_fitted(percentile_high=100, percentile_low=0).score(FeatureSet(TEST)),
                               _by_hand(VAL, TEST, 100, 0), rtol=1e-5)
    flat = _fitted(percentile_high=50, percentile_low=50)
    scores = flat.score(FeatureSet(TEST))
    assert flat.low == flat.high and np.allclose(scores, scores[0])
    # one class; D > N (a two-row validation set)
    one = LinearHead(HEAD.weight[:1], HEAD.bias[:1])
    np.testing.assert_allclose(_fitted(head=one).score(FeatureSet(TEST)), _by_hand(VAL, TEST, 90, 10, one),
                               rtol=1e-5)
    np.testing.assert_allclose(_fitted(val=VAL[:2]).score(FeatureSet(TEST)), _by_hand(VAL[:2], TEST, 90, 10),
                               rtol=1e-5)
    assert _fitted().score(FeatureSet(TEST[:0])).shape == (0,)
    with pytest.raises(ValueError, match="empty"):
        _fitted(val=VAL[:0])
    with pytest.raises(ValueError, match="percentile_low must not exceed"):
        detectors.build("vra", percentile_high=10, percentile_low=90)
    with pytest.raises(ValueError, match="percentile_low"):
        detectors.detector_class("vra").check_params({"percentile_high": 10, "percentile_low": 90})


def test_vra_round_trips(tmp_path):
    det = _fitted(percentile_high=95, percentile_low=5)
    det.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(FeatureSet(TEST)), det.score(FeatureSet(TEST)))
