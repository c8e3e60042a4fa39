"""ViM's alpha reads the stored logits when they are the head's outputs (no N x D x C product), else recomputes."""
import numpy as np
import pytest

import detectors
from detectors import FeatureSet, LinearHead


class CountingHead(LinearHead):
    """A LinearHead that counts the rows it is applied to."""

    rows = 0

    def __call__(self, features):
        CountingHead.rows += len(features)
        return super().__call__(features)


def _data(seed=0, n=3000, d=24, c=7):
    rng = np.random.default_rng(seed)
    train = (np.maximum(rng.normal(size=(n, d)) * np.linspace(3, 0.5, d) + 1, 0)).astype(np.float16)
    head = CountingHead(rng.normal(size=(c, d)), rng.normal(size=c))
    test = np.maximum(rng.normal(size=(200, d)) * 2, 0).astype(np.float16)
    return train, head, test


def test_stored_logits_give_the_recomputed_alpha_and_skip_the_product():
    train, head, test = _data()
    plain = detectors.build("vim", dim=8).fit(FeatureSet(train), head=head)
    logits = head(train.astype(np.float32)).astype(np.float16)  # as a float16 cache stores them
    CountingHead.rows = 0
    fast = detectors.build("vim", dim=8).fit(FeatureSet(train, logits), head=head)
    assert CountingHead.rows == 256  # the check rows only
    # float16 logits round each max logit by up to 2^-11 relative; their mean moves alpha by ~1e-5 here (3,000 rows)
    assert fast.alpha == pytest.approx(plain.alpha, rel=3e-5)
    np.testing.assert_allclose(fast.score(FeatureSet(test)), plain.score(FeatureSet(test)), rtol=1e-4, atol=1e-4)


def test_logits_of_another_head_are_ignored():
    train, head, _ = _data()
    plain = detectors.build("vim", dim=8).fit(FeatureSet(train), head=head)
    other = np.random.default_rng(9).normal(size=(len(train), 7)).astype(np.float16)
    CountingHead.rows = 0
    det = detectors.build("vim", dim=8).fit(FeatureSet(train, other), head=head)
    assert CountingHead.rows == 256 + len(train)  # checked, rejected, recomputed
    assert det.alpha == plain.alpha
