"""MCD: the loss and the score against a float64 numpy computation by hand, and training that raises the two heads'
discrepancy on outliers (heads mode on toy features)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.base import Detector
from detectors.metrics import auroc
from detectors.training.mcd import MCDLoss
from pipelines.training import TrainBatch


def _softmax(z, axis):
    e = np.exp(z - z.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _ce(z, y):
    return float(np.mean(-np.log(_softmax(z, 1)[np.arange(len(y)), y])))


@pytest.mark.parametrize("over", ["batch", "classes"])
def test_mcd_loss_by_hand(over):
    rng = np.random.default_rng(0)
    n, n_aux, d, c = 5, 4, 6, 3
    features = rng.normal(size=(n + n_aux, d))
    z1 = rng.normal(size=(n + n_aux, c)) * 2
    y = rng.integers(0, c, n)
    loss_fn = MCDLoss(lambda_oe=0.7, margin=1.2, entropy_over=over)
    loss_fn.setup(d, c)
    w2, b2 = loss_fn.fc2.weight.detach().double().numpy(), loss_fn.fc2.bias.detach().double().numpy()
    z2 = features @ w2.T + b2
    axis = 0 if over == "batch" else 1

    def entropy(z):
        p = _softmax(z, axis)
        return -(p * np.log(p)).sum(axis)

    ent = np.mean(entropy(z1[n:]) - entropy(z2[n:]))
    want = _ce(z1[:n], y) + _ce(z2[:n], y) + 0.7 * max(0.0, 1.2 - ent)
    batch = TrainBatch(x=torch.zeros(n, 1), y=torch.as_tensor(y))
    got = loss_fn.loss(torch.as_tensor(z1, dtype=torch.float32), torch.as_tensor(features, dtype=torch.float32), batch)
    assert float(got.detach()) == pytest.approx(want, rel=1e-5)
    # no aux rows: the two cross-entropies only
    got_id = loss_fn.loss(torch.as_tensor(z1[:n], dtype=torch.float32),
                          torch.as_tensor(features[:n], dtype=torch.float32), batch)
    assert float(got_id.detach()) == pytest.approx(_ce(z1[:n], y) + _ce(z2[:n], y), rel=1e-5)


def _toy(seed=0):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), 50)
    x = 4 * np.eye(8)[labels] + rng.normal(size=(150, 8))
    aux = 4 * np.eye(8)[rng.integers(3, 8, 120)] + rng.normal(size=(120, 8))
    ood = 4 * np.eye(8)[rng.integers(3, 8, 60)] + rng.normal(size=(60, 8))
    return (FeatureSet(x, None, labels), FeatureSet(aux, None, np.full(120, -1)), FeatureSet(ood),
            LinearHead(np.zeros((3, 8)), np.zeros(3)))


def test_mcd_trains_heads_that_disagree_on_outliers(tmp_path):
    train, aux, ood, head = _toy()
    det = (build("mcd", mode="heads", epochs=15, lr=5e-2, batch_size=32, warmup_epochs=1)
           .fit(train, head=head, id_val=train, aux=aux))
    assert det.history[-1]["acc_label"] > 0.95
    scores_id, scores_ood = det.score(train), det.score(ood)
    assert auroc(scores_id, scores_ood) > 0.8
    seen = det.transform(ood)  # the score by hand: minus the L1 distance of the two heads' softmaxes
    z2 = seen.features @ det.extra["fc2.weight"].T + det.extra["fc2.bias"]
    np.testing.assert_allclose(scores_ood, -np.abs(_softmax(seen.logits, 1) - _softmax(z2, 1)).sum(1), rtol=1e-10)
    loaded = Detector.from_pretrained(det.save_pretrained(tmp_path / "mcd"))
    np.testing.assert_array_equal(loaded.score(ood), scores_ood)
