"""The reference extracts the ID-train features its detectors fit on from a shuffled loader (Open-Insect
datasets/utils.py:87-93 with c-america.yml's `train.shuffle: True`; eval.sh:67); ours in manifest order. No
feature-level fit depends on the order beyond float summation: the scores of a fit on shuffled rows equal those of the
ordered fit (KNN's bank, OpenMax's Weibull tails, ViM's principal space, the Gaussian fits, the percentiles, the
means)."""
from __future__ import annotations

import numpy as np
import pytest

import detectors
from detectors.base import FeatureSet
from tests.helpers.toys import toy_features, toy_head

FIT_ON_TRAIN = ["knn", "openmax", "vim", "mds", "rmds", "she", "dice", "fdbd", "neco", "react", "ash", "nci", "rp_msp",
                "rp_ebo", "rp_gradnorm", "klm", "gen"]
PARAMS = {"knn": {"k": 5}, "vim": {"dim": 4}, "neco": {"dim": 4}}
RTOL = {"vim": 1e-4}  # its principal space from a float32 covariance: the summation order moves the 6th digit


@pytest.mark.parametrize("name", FIT_ON_TRAIN)
def test_a_fit_on_shuffled_rows_scores_as_the_fit_in_order(name):
    head = toy_head(8, 3)
    train = toy_features(90, 8, 3, seed=1, head=head)
    val = toy_features(30, 8, 3, seed=2, head=head)
    id_test, ood = toy_features(20, 8, 3, seed=3, head=head), toy_features(20, 8, 3, seed=4, ood=True, head=head)
    test = FeatureSet(*(np.concatenate([getattr(id_test, k), getattr(ood, k)]) for k in ("features", "logits",
                                                                                         "labels")))
    order = np.random.default_rng(7).permutation(len(train.labels))
    shuffled = FeatureSet(train.features[order], train.logits[order], train.labels[order])
    scores = []
    for rows in (train, shuffled):
        det = detectors.build(name, **PARAMS.get(name, {}))
        kwargs = {"id_val": val} if "id_val" in type(det).fit_inputs else {}
        scores.append(det.fit(rows, head=head, **kwargs).score(test))
    np.testing.assert_allclose(scores[1], scores[0], rtol=RTOL.get(name, 1e-6), atol=1e-9)
