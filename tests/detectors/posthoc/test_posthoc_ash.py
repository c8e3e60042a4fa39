"""ASH vs a torch.topk per-sample re-implementation of the official b/p/s variants."""
import numpy as np
import pytest
import torch
from scipy.special import logsumexp

import detectors
from detectors import FeatureSet, LinearHead


def torch_ash(x, percentile, variant):
    x = torch.tensor(x, dtype=torch.float64)
    out = torch.zeros_like(x)
    k = x.shape[1] - int(round(x.shape[1] * percentile / 100))
    for i, row in enumerate(x):
        values, index = torch.topk(row, k)
        if variant == "b":
            out[i, index] = row.sum() / k
        elif variant == "p":
            out[i, index] = values
        else:
            out[i, index] = values * torch.exp(row.sum() / values.sum())
    return out.numpy()


@pytest.mark.parametrize("variant", ["b", "p", "s"])
def test_ash_matches_topk_reference(variant):
    rng = np.random.default_rng(0)
    test = np.abs(rng.normal(size=(25, 20)))
    head = LinearHead(rng.normal(size=(5, 20)) / 4, rng.normal(size=5))
    det = detectors.build("ash", percentile=75, variant=variant).fit(FeatureSet(test), head=head)
    shaped = torch_ash(test, 75, variant)
    assert ((shaped != 0).sum(1) == 5).all()
    np.testing.assert_allclose(det.score(FeatureSet(test)), logsumexp(shaped @ head.weight.T + head.bias, axis=1), rtol=1e-5)


def test_ash_p_at_percentile_0_is_plain_energy_and_bad_variant_raises():
    rng = np.random.default_rng(1)
    test = rng.normal(size=(10, 8))
    head = LinearHead(rng.normal(size=(3, 8)), rng.normal(size=3))
    det = detectors.build("ash", percentile=0, variant="p").fit(FeatureSet(test), head=head)
    np.testing.assert_allclose(det.score(FeatureSet(test)), logsumexp(test @ head.weight.T + head.bias, axis=1), rtol=1e-5)
    with pytest.raises(ValueError, match="variant"):
        detectors.build("ash", variant="x").fit(FeatureSet(test), head=head)
