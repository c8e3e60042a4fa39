"""VRA as OpenOOD runs it (`thresholds: global`, `fit_split: id_val`, `below: clip`, the openood_v1.5 protocol's
setting) against OpenOOD's own postprocessor (golden scores and thresholds from vra_postprocessor.py, made by
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
OPENOOD = {"thresholds": "global", "fit_split": "id_val", "below": "clip"}


def _fitted(val=VAL, head=HEAD, high=90, low=10):
    """OpenOOD's percentiles (in percent) as our quantiles (fractions)."""
    return detectors.build("vra", **OPENOOD, high=high / 100, low=low / 100).fit(FeatureSet(TEST[:2]), head=head,
                                                                               id_val=FeatureSet(val))


def _by_hand(val, test, high, low, head=HEAD):
    lo, hi = np.percentile(val.astype(np.float64), [low, high])
    z = np.clip(test.astype(np.float64), lo, hi) @ head.weight.T.astype(np.float64) + head.bias
    return z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1))


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{c['percentile_high']}-{c['percentile_low']}")
def test_vra_global_is_openoods(case):
    high, low = case["percentile_high"], case["percentile_low"]
    det = _fitted(high=high, low=low)
    np.testing.assert_allclose([det.lower[0], det.upper[0]], case["thresholds"], rtol=1e-6)
    ours = det.score(FeatureSet(TEST))
    np.testing.assert_allclose(ours, case["scores"], rtol=1e-5)
    np.testing.assert_allclose(ours, _by_hand(VAL, TEST, high, low), rtol=1e-5)


def test_openood_protocol_runs_openoods_setting():
    cls = detectors.detector_class("vra")
    assert cls.protocol_defaults["openood_v1.5"] == {"low": 0.10, "high": 0.90, **OPENOOD}  # vra.yml:5-6
    with pytest.raises(ValueError, match="fit_split='id_val'"):
        detectors.build("vra", fit_split="id_val").fit(FeatureSet(VAL), head=HEAD)
    on_train = detectors.build("vra", thresholds="global", below="clip", low=0.1, high=0.9).fit(FeatureSet(VAL),
                                                                                                head=HEAD)
    np.testing.assert_allclose(on_train.score(FeatureSet(TEST)), _by_hand(VAL, TEST, 90, 10), rtol=1e-5)


def test_vra_global_edges():
    # the whole range: plain energy; ties: equal low and high clip every activation to one value
    np.testing.assert_allclose(_fitted(high=100, low=0).score(FeatureSet(TEST)), _by_hand(VAL, TEST, 100, 0),
                               rtol=1e-5)
    flat = _fitted(high=50, low=50)
    scores = flat.score(FeatureSet(TEST))
    assert flat.lower[0] == flat.upper[0] and np.allclose(scores, scores[0])
    # one class; D > N (a two-row validation set)
    one = LinearHead(HEAD.weight[:1], HEAD.bias[:1])
    np.testing.assert_allclose(_fitted(head=one).score(FeatureSet(TEST)), _by_hand(VAL, TEST, 90, 10, one),
                               rtol=1e-5)
    np.testing.assert_allclose(_fitted(val=VAL[:2]).score(FeatureSet(TEST)), _by_hand(VAL[:2], TEST, 90, 10),
                               rtol=1e-5)
    assert _fitted().score(FeatureSet(TEST[:0])).shape == (0,)
    with pytest.raises(ValueError, match="no id_val features"):
        _fitted(val=VAL[:0])


def test_vra_global_round_trips(tmp_path):
    det = _fitted(high=95, low=5)
    det.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(FeatureSet(TEST)), det.score(FeatureSet(TEST)))
