"""Residual against OpenOOD's own postprocessor (golden scores from residual_postprocessor.py, made by
golden/make_residual.py at the commit golden/residual.json names) and a float64 replay by hand, plus its edges."""
import json
from pathlib import Path

import numpy as np
import pytest

import detectors
from detectors import FeatureSet, LinearHead

GOLDEN = json.loads((Path(__file__).parent / "golden" / "residual.json").read_text())
INPUTS = {k: np.asarray(v, dtype=np.float32) for k, v in GOLDEN["inputs"].items() if k != "small_rows"}
HEAD = LinearHead(INPUTS["weight"], INPUTS["bias"])
FIT, TEST = INPUTS["fit"], INPUTS["test"]


def _ours(fit, test=TEST, head=HEAD, **params):
    det = detectors.build("residual", **params).fit(FeatureSet(fit[:3]), head=head, id_val=FeatureSet(fit))
    return det.score(FeatureSet(test))


def _by_hand(fit, test, dim, head=HEAD):
    """The reference's steps in float64: u = -pinv(W) b, (h-u)^T (h-u) / N, eigenvectors past the dim largest."""
    w, b = head.weight.astype(np.float64), head.bias.astype(np.float64)
    u = -np.linalg.pinv(w) @ b
    t = fit.astype(np.float64) - u
    values, vectors = np.linalg.eigh(t.T @ t / len(t))
    null = vectors[:, np.argsort(-values)[dim:]]
    return -np.linalg.norm((test.astype(np.float64) - u) @ null, axis=1)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{c['fit']}-dim{c['dim']}")
def test_residual_is_openoods(case):
    fit = FIT if case["fit"] == "fit" else FIT[:GOLDEN["inputs"]["small_rows"]]
    ours = _ours(fit, dim=case["dim"])
    np.testing.assert_allclose(ours, case["scores"], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(ours, _by_hand(fit, TEST, case["dim"]), rtol=1e-5, atol=1e-5)


def test_residual_defaults_and_fit_split():
    cls = detectors.detector_class("residual")
    assert cls.defaults == {"dim": None, "fit_split": "id_val"} and cls.search_space == {}  # residual.yml: no sweep
    det = detectors.build("residual").fit(FeatureSet(FIT[:3]), head=HEAD, id_val=FeatureSet(FIT))
    assert det.effective_params()["dim"] == 8  # D = 16 < 512: ViM's rule, D // 2
    train = detectors.build("residual", dim=4, fit_split="id_train").fit(FeatureSet(FIT), head=HEAD)
    np.testing.assert_allclose(train.score(FeatureSet(TEST)), _by_hand(FIT, TEST, 4), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="id_val"):
        detectors.build("residual").fit(FeatureSet(FIT), head=HEAD)
    with pytest.raises(ValueError, match="dim"):
        detectors.build("residual", dim=16).fit(FeatureSet(FIT), head=HEAD, id_val=FeatureSet(FIT))


def test_residual_edges():
    # D > N: a singular covariance whose null space lies in the residual (dim below the rank)
    np.testing.assert_allclose(_ours(FIT[:6], dim=3), _by_hand(FIT[:6], TEST, 3), rtol=1e-5, atol=1e-5)
    # one class: W is 1 x D, u = -b w / ||w||^2
    one = LinearHead(HEAD.weight[:1], HEAD.bias[:1])
    np.testing.assert_allclose(_ours(FIT, head=one, dim=5), _by_hand(FIT, TEST, 5, one), rtol=1e-5, atol=1e-5)
    # ties: equal rows score alike; a row on the principal space through u scores 0 (the best)
    det = detectors.build("residual", dim=15).fit(FeatureSet(FIT[:3]), head=HEAD, id_val=FeatureSet(FIT))
    tied = det.score(FeatureSet(np.stack([TEST[0], TEST[0]])))
    assert tied[0] == tied[1]
    origin = det.origin.astype(np.float32)[None]
    assert det.score(FeatureSet(origin))[0] == pytest.approx(0.0, abs=1e-5)
    assert det.score(FeatureSet(TEST[:0])).shape == (0,)
    with pytest.raises(ValueError, match="no rows"):
        detectors.build("residual").fit(FeatureSet(FIT[:3]), head=HEAD, id_val=FeatureSet(FIT[:0]))


def test_residual_round_trips(tmp_path):
    det = detectors.build("residual", dim=12).fit(FeatureSet(FIT[:3]), head=HEAD, id_val=FeatureSet(FIT))
    det.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(FeatureSet(TEST)), det.score(FeatureSet(TEST)))
