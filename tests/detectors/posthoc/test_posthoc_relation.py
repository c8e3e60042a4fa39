"""RELATION against OpenOOD's own postprocessor (golden scores from relation_postprocessor.py, made by
golden/make_relation.py at the commit golden/relation.json names) and a float64 replay by hand, plus its edges."""
import json
from pathlib import Path

import numpy as np
import pytest

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc import relation

GOLDEN = json.loads((Path(__file__).parent / "golden" / "relation.json").read_text())
INPUTS = {k: np.asarray(v, dtype=np.float32) for k, v in GOLDEN["inputs"].items()}
HEAD = LinearHead(INPUTS["weight"], INPUTS["bias"])
TRAIN, TEST = INPUTS["train"], INPUTS["test"]


def _set(h, head=HEAD):
    return FeatureSet(h, logits=head(h))


def _ours(train=TRAIN, test=TEST, head=HEAD, **params):
    return detectors.build("relation", **params).fit(_set(train, head)).score(_set(test, head))


def _by_hand(train, test, power, threshold=0.03, head=HEAD):
    """The reference's formula in float64."""
    def unit(h):
        h = h.astype(np.float64)
        return h / np.sqrt((h ** 2).sum(1, keepdims=True) + 1e-10)

    def prob(h):
        z = head(h).astype(np.float64)
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    rel = np.maximum(unit(test) @ unit(train).T, 0) * (prob(test) @ prob(train).T)
    return (np.where(rel > threshold, rel, 0.0) ** power).sum(1)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"pow{c['pow']}")
def test_relation_is_openoods(case):
    ours = _ours(pow=case["pow"])
    np.testing.assert_allclose(ours, case["scores"], rtol=2e-5, atol=1e-9)
    np.testing.assert_allclose(ours, _by_hand(TRAIN, TEST, case["pow"]), rtol=1e-5, atol=1e-9)


def test_relation_defaults_and_the_cut_acts():
    cls = detectors.detector_class("relation")
    assert cls.defaults == {"pow": 1, "threshold": 0.03} and cls.search_space == {"pow": [1, 2, 4, 6, 8]}
    uncut = _by_hand(TRAIN, TEST, 1, threshold=-1.0)
    assert np.all(uncut >= _ours()) and np.any(uncut > _ours() + 1e-6)  # the 0.03 cut removed some edges
    np.testing.assert_allclose(_ours(threshold=0.0), _by_hand(TRAIN, TEST, 1, threshold=0.0), rtol=1e-5)


def test_relation_edges(monkeypatch):
    # one class: every probability is 1, the relation is the clamped cosine
    one = LinearHead(HEAD.weight[:1], HEAD.bias[:1])
    np.testing.assert_allclose(_ours(head=one, pow=2), _by_hand(TRAIN, TEST, 2, head=one), rtol=1e-5)
    # D > N: a two-row bank
    np.testing.assert_allclose(_ours(train=TRAIN[:2]), _by_hand(TRAIN[:2], TEST, 1), rtol=1e-5, atol=1e-12)
    # ties: a repeated test row scores alike; a zero row relates to nothing (0, the lowest score)
    scores = _ours(test=np.stack([TEST[3], TEST[3], np.zeros_like(TEST[0])]))
    assert scores[0] == scores[1] and scores[2] == 0.0
    # small blocks give the same sums
    monkeypatch.setattr(relation, "BLOCK_ENTRIES", 7)
    np.testing.assert_allclose(_ours(pow=4), _by_hand(TRAIN, TEST, 4), rtol=1e-5, atol=1e-12)
    assert _ours(test=TEST[:0]).shape == (0,)
    with pytest.raises(ValueError, match="no rows"):
        detectors.build("relation").fit(_set(TRAIN[:0]))


def test_relation_round_trips(tmp_path):
    det = detectors.build("relation", pow=2).fit(_set(TRAIN))
    det.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(_set(TEST)), det.score(_set(TEST)))
