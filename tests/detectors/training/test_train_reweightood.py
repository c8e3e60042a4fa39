"""ReweightOOD against one training step of OpenOOD's own trainer and its postprocessor's scores (golden numbers made by
golden/make_reweightood.py at the commit golden/reweightood.json names), a float64 hand computation of the loss, the
edges (one row, one class, no negative pair) and heads mode against the `mds` detector."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.training.embedding import unit_rows
from detectors.training.reweightood import ReweightOODLoss
from pipelines.training import TrainBatch

GOLDEN = json.loads((Path(__file__).parent / "golden" / "reweightood.json").read_text())
F32 = dict(dtype=torch.float32)


def _objective(case: dict) -> ReweightOODLoss:
    weights = {k: torch.tensor(v, **F32) for k, v in case["inputs"]["weights"].items()}
    objective = ReweightOODLoss(feat_dim=weights["2.weight"].shape[0])
    objective.setup(weights["0.weight"].shape[1], case["classes"])
    objective.projection.load_state_dict(weights)
    return objective


def test_golden_is_openood_at_the_recorded_commit():
    assert GOLDEN["openood_commit"].startswith("3c35632") and GOLDEN["made_by"].endswith("make_reweightood.py")
    params = build("reweightood").params
    assert {k: params[k] for k in GOLDEN["defaults"]} == GOLDEN["defaults"]
    assert params["feat_dim"] == 128 and params["projection"] == "mlp"


@pytest.mark.parametrize("index", range(len(GOLDEN["cases"])))
def test_one_step_equals_openood_reweightood_trainer(index):
    """Loss, gradients and the reference's SGD step (nesterov, momentum 0.9, weight decay 1e-4, its warm-up lr) from
    our gradients; cases 1 and 2 have no negative pair (one row; one class): -1, no gradient, as there."""
    case = GOLDEN["cases"][index]
    objective = _objective(case)
    views = torch.cat([torch.tensor(v, **F32) for v in case["inputs"]["views"]])
    y = torch.tensor(case["inputs"]["y"]).repeat(2)
    loss = objective.loss(None, views, TrainBatch(x=views, y=y))
    assert float(loss.detach()) == pytest.approx(case["loss"], rel=1e-6)
    optimizer = torch.optim.SGD(objective.projection.parameters(), case["lr"], momentum=0.9, weight_decay=1e-4,
                                nesterov=True)
    optimizer.zero_grad()
    loss.backward()
    for name, p in objective.projection.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), case["grads"][name], rtol=1e-4, atol=1e-6)
    optimizer.step()
    for name, p in objective.projection.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), case["stepped"][name], atol=1e-7)


def _lse(v):
    return -np.inf if len(v) == 0 else v.max() + np.log(np.exp(v - v.max()).sum())


def _by_hand(z, y, temp=0.1, m_b=5.0, c_b=4.0, m_w=2.0, c_w=1.0):
    """float64, pair by pair (i < j)."""
    pos, neg = [], []
    for i in range(len(z)):
        for j in range(i + 1, len(z)):
            (pos if y[i] == y[j] else neg).append(z[i] @ z[j])
    pos, neg = np.array(pos), np.array(neg)
    w_pos, w_neg = 1 / (1 + np.exp(m_w * pos - c_w)), 1 / (1 + np.exp(-(m_b * neg - c_b)))
    x = _lse(-w_pos * pos / temp) + _lse(w_neg * neg / temp)
    return x if x > 0 else np.expm1(x)


def test_loss_by_hand_in_float64():
    rng = np.random.default_rng(4)
    torch.manual_seed(0)
    objective = ReweightOODLoss(feat_dim=5)
    objective.setup(7, 3)
    h, y = rng.normal(size=(9, 7)), rng.integers(0, 3, 9)
    z = objective.projection(torch.tensor(h, **F32)).detach().double().numpy()
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    got = objective.loss(None, torch.tensor(h, **F32), TrainBatch(x=torch.zeros(9, 7), y=torch.tensor(y)))
    assert float(got.detach()) == pytest.approx(_by_hand(z, y), rel=1e-5)


def test_edges_one_row_and_one_class():
    torch.manual_seed(0)
    objective = ReweightOODLoss(feat_dim=3)
    objective.setup(4, 2)
    for rows, y in ((1, [0]), (5, [1] * 5)):  # no pair at all; no negative pair
        h = torch.randn(rows, 4, requires_grad=True)
        loss = objective.loss(None, h, TrainBatch(x=h, y=torch.tensor(y)))
        loss.backward()
        assert float(loss.detach()) == -1.0 and torch.all(h.grad == 0)


def test_postprocessor_scores_equal_openood():
    """The score rule on the normalised features equals ReweightOODPostprocessor's (sklearn's covariance)."""
    ref = GOLDEN["postprocessor"]
    det = build("reweightood", mode="heads")
    det.extra = det.fit_rule(unit_rows(np.float32(ref["train_x"])), np.asarray(ref["train_y"]))
    np.testing.assert_allclose(det.rule_scores(unit_rows(np.float32(ref["test_x"]))), ref["scores"], rtol=1e-6,
                               atol=1e-6)


def test_heads_mode_scores_mds_on_the_normalised_frozen_features(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 6)) * 3
    y = np.repeat(np.arange(3), 40)
    train = FeatureSet(centres[y] + rng.normal(size=(120, 6)), None, y)
    test = FeatureSet(rng.normal(size=(30, 6)) * 4, None, None)
    head = LinearHead(rng.normal(size=(3, 6)), np.zeros(3))
    det = build("reweightood", mode="heads", epochs=2, batch_size=16, warmup_epochs=0).fit(train, head=head)
    mds = build("mds").fit(FeatureSet(unit_rows(train.features), None, y))
    np.testing.assert_allclose(det.score(test), mds.score(FeatureSet(unit_rows(test.features), None, None)),
                               rtol=1e-9, atol=1e-9)
    assert np.isfinite(det.history[-1]["loss"]) and det.extra["projection.0.weight"].shape == (6, 6)
    np.testing.assert_allclose(det.head.weight, head.weight)  # the closed-set head gets no gradient
    det.save_pretrained(tmp_path / "rw")
    np.testing.assert_array_equal(type(det).from_pretrained(tmp_path / "rw").score(test), det.score(test))
