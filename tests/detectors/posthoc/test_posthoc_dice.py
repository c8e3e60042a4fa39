"""DICE vs OpenOOD's vote formulation (h[:, None, :] * masked W, summed) with a hand-made mask."""
import numpy as np
from scipy.special import logsumexp

import detectors
from detectors import FeatureSet, LinearHead


def test_dice_matches_vote_formulation():
    rng = np.random.default_rng(0)
    train, test = np.abs(rng.normal(size=(200, 10))), np.abs(rng.normal(size=(30, 10)))
    head = LinearHead(rng.normal(size=(4, 10)), rng.normal(size=4))
    det = detectors.build("dice", percentile=70).fit(FeatureSet(train), head=head)
    contribution = train.mean(0)[None, :] * head.weight
    ranked = np.sort(contribution.ravel())
    pos = 0.7 * (ranked.size - 1)
    threshold = ranked[int(pos)] + (pos - int(pos)) * (ranked[int(pos) + 1] - ranked[int(pos)])
    masked = np.where(contribution > threshold, head.weight, 0.0)
    assert (masked != 0).sum() == round(0.3 * masked.size)
    vote = (test[:, None, :] * masked[None]).sum(2) + head.bias
    np.testing.assert_allclose(det.score(FeatureSet(test)), logsumexp(vote, axis=1), rtol=1e-5)
