"""ASH vs a per-sample numpy argsort re-implementation of the official b/p/s variants."""
import numpy as np
import pytest
from scipy.special import logsumexp

import detectors
from detectors import FeatureSet, LinearHead


def loop_ash(x, percentile, variant):
    out = np.zeros_like(x)
    k = x.shape[1] - int(round(x.shape[1] * percentile / 100))
    for i, row in enumerate(x):
        index = np.argsort(-row, kind="stable")[:k]
        if variant == "b":
            out[i, index] = row.sum() / k
        elif variant == "p":
            out[i, index] = row[index]
        else:
            out[i, index] = row[index] * np.exp(row.sum() / row[index].sum())
    return out


@pytest.mark.parametrize("variant", ["b", "p", "s"])
def test_ash_matches_loop_reference(variant):
    rng = np.random.default_rng(0)
    test = np.abs(rng.normal(size=(25, 20)))
    head = LinearHead(rng.normal(size=(5, 20)) / 4, rng.normal(size=5))
    det = detectors.build("ash", percentile=75, variant=variant).fit(FeatureSet(test), head=head)
    shaped = loop_ash(test, 75, variant)
    assert ((shaped != 0).sum(1) == 5).all()
    np.testing.assert_allclose(det.score(FeatureSet(test)), logsumexp(shaped @ head.weight.T + head.bias, axis=1),
                               rtol=1e-5)


def test_ash_p_at_percentile_0_is_plain_energy_and_bad_variant_raises():
    rng = np.random.default_rng(1)
    test = rng.normal(size=(10, 8))
    head = LinearHead(rng.normal(size=(3, 8)), rng.normal(size=3))
    det = detectors.build("ash", percentile=0, variant="p").fit(FeatureSet(test), head=head)
    np.testing.assert_allclose(det.score(FeatureSet(test)), logsumexp(test @ head.weight.T + head.bias, axis=1),
                               rtol=1e-5)
    with pytest.raises(ValueError, match="variant"):
        detectors.build("ash", variant="x").fit(FeatureSet(test), head=head)


@pytest.mark.parametrize("variant", ["b", "p", "s"])
def test_sparse_logits_equal_the_dense_head_product(variant):
    """ash_logits sums the kept columns of W (embedding_bag); it must equal W ash(h) + b formed densely in float64."""
    from detectors.posthoc.ash import ash, ash_logits

    rng = np.random.default_rng(2)
    h = np.abs(rng.normal(size=(40, 64)))
    weight, bias = rng.normal(size=(7, 64)), rng.normal(size=7)
    dense = ash(h, 90, variant) @ weight.T + bias
    np.testing.assert_allclose(ash_logits(h, weight, bias, 90, variant), dense, rtol=1e-12, atol=1e-12)
